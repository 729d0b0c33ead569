"""What an attempt keeps besides its outcome: a failure's traceback and its last log lines, bounded
and with secrets hidden (celeryapp/worker/step_log.py). The worker-level check (a real failing step,
its activity and Flower) is in tests/test_flower.py."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from celeryapp.domain.limits import LOG_TAIL_CHARS, LOG_TAIL_LINES, TRACEBACK_CHARS
from celeryapp.domain.redaction import HIDDEN, hide_secrets
from celeryapp.errors import StepError
from celeryapp.worker import runner, step_log
from celeryapp.worker.step_kinds import run_executable

logger = logging.getLogger("tests.step_log")


@pytest.fixture(autouse=True)
def info_level() -> Iterator[None]:
    # The worker logs at INFO (``-l INFO``); the root's WARNING default here would drop the lines.
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.INFO)
    yield
    root.setLevel(level)


def _bottom() -> None:
    raise ValueError("the bottom says no; see postgresql://app:s3cret@db.internal/app")


def _deep(depth: int) -> None:
    """Call _bottom through ``depth`` distinct frames (repeated ones Python prints once)."""
    scope: dict[str, object] = {"f0": _bottom}
    for i in range(1, depth + 1):
        exec(f"def f{i}():\n    f{i - 1}()", scope)
    scope[f"f{depth}"]()  # type: ignore[operator]


def test_a_traceback_keeps_its_last_frames_and_the_raising_line_within_its_bound() -> None:
    try:
        _deep(800)  # far more frames than TRACEBACK_CHARS holds
    except ValueError as exc:
        text = step_log.traceback_text(exc)
    assert len(text) <= TRACEBACK_CHARS
    assert text.startswith("[... ") and "characters of the traceback cut" in text.splitlines()[0]
    assert 'raise ValueError("the bottom says no' in text and "in f1\n" in text and "in f800\n" not in text
    assert text.rstrip().endswith(f"ValueError: the bottom says no; see postgresql://app:{HIDDEN}@db.internal/app")
    assert "s3cret" not in text


def test_a_short_traceback_is_kept_whole() -> None:
    try:
        _deep(1)
    except ValueError as exc:
        text = step_log.traceback_text(exc)
    assert text.startswith("Traceback (most recent call last):") and "cut" not in text


def test_the_log_tail_keeps_the_last_lines_of_the_steps_own_thread() -> None:
    def elsewhere() -> None:
        logger.warning("another step's line")

    with step_log.capturing_log() as tail:
        for number in range(200):
            logger.info("record %s token=abc%s", number, number)
        other = threading.Thread(target=elsewhere)
        other.start()
        other.join()
        # (WARNING: a Celery worker set up in this process sets its task loggers' level.)
        logging.getLogger("celery.task.hr").warning("a task logger's line")
    text = tail.text()
    assert text is not None
    lines = text.splitlines()
    assert len(lines) == LOG_TAIL_LINES
    assert lines[0].endswith(f"INFO tests.step_log: record 151 token={HIDDEN}")
    # Read later, in another zone: the time is UTC and says so, whatever the worker's zone.
    stamp = datetime.strptime(lines[0].split(" UTC ")[0], "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    assert abs((stamp - datetime.now(UTC)).total_seconds()) < 60
    assert lines[-2].endswith("record 199 token=<hidden>")
    assert lines[-1].endswith("a task logger's line")
    assert "another step's line" not in text and "abc" not in text
    # The handler is gone once the attempt ended.
    assert tail not in logging.getLogger().handlers and tail not in logging.getLogger("celery.task").handlers


def test_the_log_tail_is_bounded_in_characters_and_none_when_nothing_was_logged() -> None:
    with step_log.capturing_log() as tail:
        for _ in range(LOG_TAIL_LINES):
            logger.info("x" * 1000)
    text = tail.text()
    assert text is not None and len(text) <= LOG_TAIL_CHARS and "characters of log cut" in text
    with step_log.capturing_log() as quiet:
        pass
    assert quiet.text() is None


def test_an_executables_output_is_its_log_tail_whatever_its_exit_code() -> None:
    script = "import sys\nfor i in range(80): print('line', i)\nsys.exit(3)"
    with step_log.capturing_log() as tail, pytest.raises(StepError, match="exit code 3"):
        run_executable([sys.executable, "-c", script], allow=(sys.executable,))
    text = tail.text()
    assert text is not None
    assert text.splitlines() == [f"line {i}" for i in range(30, 80)]
    step_log.note_output("outside any step: dropped")  # no attempt running: nothing to add to


def test_secrets_in_free_text_are_hidden() -> None:
    assert (
        hide_secrets("redis://:pw@h:6379/0 and amqp://u:p%40ss@h//")
        == f"redis://:{HIDDEN}@h:6379/0 and amqp://u:{HIDDEN}@h//"
    )
    assert hide_secrets("connect(password='hunter2', user='x')") == f"connect(password='{HIDDEN}', user='x')"
    assert hide_secrets("see https://example.com/a:b and a@b") == "see https://example.com/a:b and a@b"
    assert (
        hide_secrets("PASSWORD: x1 api_key=k2 secret = 's3'")
        == f"PASSWORD: {HIDDEN} api_key={HIDDEN} secret = '{HIDDEN}'"
    )
    # A parser's message is not a secret.
    assert hide_secrets("JSONDecodeError: unexpected token: '}'") == "JSONDecodeError: unexpected token: '}'"


def test_storable_text_keeps_the_end_of_a_traceback() -> None:
    text = "head\x00" + "y" * 100 + "THE END"
    kept = runner._storable(text, 20, keep_end=True)
    assert kept == "y" * 13 + "THE END"
    assert runner._storable("a\x00b", 20) == "a\\x00b"
