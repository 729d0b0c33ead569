"""What an attempt leaves for people besides its outcome: a failure's traceback and its last log lines.

Both are kept on the attempt's activity (``activities.traceback`` and ``log_tail``), bounded and
with secrets hidden, and shown on the dashboard, in the CLI and (the traceback) in Flower.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from celeryapp.domain.limits import LOG_TAIL_CHARS, LOG_TAIL_LINES, TRACEBACK_CHARS
from celeryapp.domain.redaction import hide_secrets

#: Loggers the tail listens on besides the root: Celery's task loggers (``get_task_logger``) do
#: not propagate to the root logger.
_NON_PROPAGATING = ("celery.task",)
#: Each kept line as a worker's log shows it, without the process name (one attempt, one process),
#: its time in UTC and saying so: the line is read later, elsewhere, by someone in another zone.
LINE_FORMAT = "%(asctime)s UTC %(levelname)s %(name)s: %(message)s"
#: To the second: the lines are in order, and a person reads them at 80 columns.
LINE_TIME_FORMAT = "%Y-%m-%d %H:%M:%S"


def _cut_head(text: str, limit: int, what: str) -> str:
    """The end of ``text`` in at most ``limit`` characters: the end is what tells (the raising
    frames, the last lines), and a marker says how much was cut."""
    if len(text) <= limit:
        return text
    room = limit - len(f"[... {len(text)} characters of {what} cut ...]\n")
    kept = text[-room:]
    if "\n" in kept[:-1]:  # from a line's start, not the middle of one
        kept = kept[kept.index("\n") + 1 :]
    return f"[... {len(text) - len(kept)} characters of {what} cut ...]\n" + kept


def traceback_text(exc: BaseException) -> str:
    """``exc``'s traceback as Python prints it, its last frames kept within ``TRACEBACK_CHARS``."""
    text = hide_secrets("".join(traceback.format_exception(exc)))
    return _cut_head(text, TRACEBACK_CHARS, "the traceback")


class LogTail(logging.Handler):
    """The last ``LOG_TAIL_LINES`` lines logged by one thread (the step's), and the output its
    step kind adds (an executable's)."""

    def __init__(self) -> None:
        super().__init__()
        self.thread = threading.get_ident()
        self.lines: deque[str] = deque(maxlen=LOG_TAIL_LINES)
        self._last: logging.LogRecord | None = None
        formatter = logging.Formatter(LINE_FORMAT, datefmt=LINE_TIME_FORMAT)
        formatter.converter = time.gmtime
        self.setFormatter(formatter)

    def emit(self, record: logging.LogRecord) -> None:
        # Other threads of the process (the heartbeat's, a thread pool's other steps) are not this step.
        # A record reaching it twice (a task logger that propagates after all) is kept once.
        if record.thread != self.thread or record is self._last:
            return
        self._last = record
        try:
            self.add(self.format(record))
        except Exception:
            self.handleError(record)

    def add(self, text: str) -> None:
        self.lines.extend(text.splitlines())

    def text(self) -> str | None:
        """What is kept, or ``None`` when nothing was logged."""
        if not self.lines:
            return None
        return _cut_head(hide_secrets("\n".join(self.lines)), LOG_TAIL_CHARS, "log")


_current: ContextVar[LogTail | None] = ContextVar("chordbeat_log_tail", default=None)


@contextmanager
def capturing_log() -> Iterator[LogTail]:
    """Keep the last lines this thread logs during the block (the step's own code)."""
    tail = LogTail()
    loggers = [logging.getLogger(), *(logging.getLogger(name) for name in _NON_PROPAGATING)]
    for logger in loggers:
        logger.addHandler(tail)
    token = _current.set(tail)
    try:
        yield tail
    finally:
        _current.reset(token)
        for logger in loggers:
            logger.removeHandler(tail)


def note_output(text: str) -> None:
    """Add a step's program output to the running attempt's log tail (nothing outside a step)."""
    tail = _current.get()
    if tail is not None and text:
        tail.add(text)
