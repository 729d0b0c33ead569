"""The CLI's small manners, at an 80-column terminal against a real worker: every output ends
with a newline, a mistyped schedule gets a "did you mean", a broker that wants a password gets a
hint at once, pause asks why as well as whether, and a resume of an active schedule says so and
writes no second audit row."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from tests.support import processes
from tests.support.helpers import call, finished, step
from tests.support.servers import RedisServer
from tests.support.terminals import CURSOR, in_pty, plain_lines

CHORDBEAT = str(Path(sys.executable).with_name("chordbeat"))
#: What a terminal shows of an output: no escape sequences (colours, the cursor shown again).
ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def _terminal(settings: Settings, *args: str, replies: dict[str, str] | None = None, **env: str) -> tuple[int, str]:
    """The real ``chordbeat`` in an 80-column pty: exit status and the output as the terminal got it."""
    environment = processes.settings_env(settings, TERM="xterm-256color", TZ="UTC", **env)
    return in_pty([CHORDBEAT, *args], environment, columns=80, timeout=60, replies=replies)


def _text(output: str) -> str:
    return " ".join("\n".join(plain_lines(output)).split())


@pytest.mark.timeout(120)
def test_every_output_ends_with_a_newline(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings
) -> None:
    call(client, "chordbeat.apply_schedule", definition={"name": "nightly", "every": 3600, "steps": [step("s")]})
    run = finished(client, call(client, "chordbeat.trigger_schedule", name="nightly")["execution_id"])
    for command in (
        ("list",),
        ("show", "nightly"),
        ("execution", str(run["id"])),
        ("run", "nightly", "--wait"),
        ("run", "nightly"),
        ("show", "nope"),  # an error too
        ("pause", "nightly", "--yes", "--reason", "r"),
        ("resume", "nightly"),
        ("alerts",),
        ("backfills", "nightly"),
        ("rerun", str(run["id"])),
        ("delete", "nightly"),  # asked, and no
    ):
        status, output = _terminal(settings, *command, replies={"assword": "x\n", "[y/N]": "n\n"})
        shown = ESCAPES.sub("", output).replace("\r", "")
        assert shown.endswith("\n"), (command, status, repr(output[-200:]))
    # Ctrl-C at a question: "nothing changed" on a line of its own, not after the prompt.
    environment = processes.settings_env(settings, TERM="xterm-256color", TZ="UTC")
    status, output = in_pty([CHORDBEAT, "delete", "nightly"], environment, columns=80, interrupt_on="[y/N]")
    shown = ESCAPES.sub("", output).replace("\r", "")
    assert status == 1 and shown.endswith("[y/N]: \nnothing changed\n"), repr(shown[-200:])


def test_a_mistyped_schedule_name_gets_a_did_you_mean(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings
) -> None:
    for name in ("nightly-hr-sync", "weekly-report"):
        call(client, "chordbeat.apply_schedule", definition={"name": name, "every": 3600, "steps": [step("s")]})
    status, output = _terminal(settings, "show", "nightly-hr-synk")
    text = _text(output)
    assert status == 1 and "schedule 'nightly-hr-synk' does not exist; did you mean 'nightly-hr-sync'?" in text, text
    status, output = _terminal(settings, "pause", "zzz", "--yes")
    assert status == 1 and "does not exist" in output and "did you mean" not in output, output


def test_pause_asks_why_and_a_resume_of_an_active_schedule_changes_nothing(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings
) -> None:
    call(client, "chordbeat.apply_schedule", definition={"name": "nightly", "every": 3600, "steps": [step("s")]})
    status, output = _terminal(
        settings, "pause", "nightly", replies={"why pause nightly?": "disk full\n", "[y/N]": "y\n"}
    )
    text = _text(output)
    assert status == 0 and "because: disk full? [y/N]" in text and "nightly: paused" in text, text
    assert call(client, "chordbeat.get_schedule", name="nightly")["paused_reason"] == "disk full"
    status, output = _terminal(settings, "resume", "nightly")
    assert status == 0 and "nightly: active, next " in _text(output), output
    status, output = _terminal(settings, "resume", "nightly")
    text = _text(output)
    assert status == 0 and "nightly: already active, next " in text and "nothing changed" in text, text
    actions = [r["action"] for r in call(client, "chordbeat.list_audit", schedule="nightly")]
    assert actions == ["resume", "pause", "apply"], actions


def test_without_the_brokers_password_the_cli_says_what_to_set(settings: Settings) -> None:
    server = RedisServer(password="s3cret-broker")
    server.start()
    try:
        url = f"redis://127.0.0.1:{server.port}/0"  # no password, as without `. .run/cli.env`
        status, output = _terminal(settings, "list", CHORDBEAT_BROKER_URL=url, CHORDBEAT_RESULT_BACKEND=url)
        text = _text(CURSOR.sub("", output))
        assert status == 1, text
        assert "Authentication required: the broker (redis://127.0.0.1:" in text, text
        assert "asks for a password and CHORDBEAT_BROKER_URL gives none" in text, text
        assert "CHORDBEAT_BROKER_URL (redis://:PASSWORD@host:port/0)" in text and "`. .run/cli.env`" in text, text
        wrong = f"redis://:not-it@127.0.0.1:{server.port}/0"
        status, output = _terminal(settings, "list", CHORDBEAT_BROKER_URL=wrong, CHORDBEAT_RESULT_BACKEND=wrong)
        text = _text(output)
        assert status == 1 and "refused its password" in text and "not-it" not in text, text
    finally:
        server.stop()
