"""Celery's soft time limit, raised only in the step it was meant for.

A step with a timeout is sent with Celery's soft time limit: when it passes, the worker's main
process sends the pool process ``SIGUSR1`` and billiard's handler raises
:class:`SoftTimeLimitExceeded` in whatever that process runs then. It interrupts a step blocked in a
system call, which the step watch's interrupt (it lands at the next bytecode) cannot. But the main
process's timer can fire after the task it was for has ended, when the result is not read yet: the
exception then lands in the process's next task (a step without a timeout, or one far from its
own), or in billiard's idle loop, which kills the pool process. So the handler installed here
raises only while this process runs a step whose soft limit is due, and logs and ignores the rest.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from celery.exceptions import SoftTimeLimitExceeded

logger = logging.getLogger(__name__)

#: How early a soft limit may arrive for the step it is for: the main process starts its timer when
#: the pool process takes the task, a little before the runner notes the time.
EARLY_S = 1.0

#: Monotonic time from which this process's running step may be sent its soft limit (``None``: no
#: step with a timeout is running). Only the process's main thread runs steps and handles signals.
_due: float | None = None


def _handle(signum: int, frame: FrameType | None) -> None:
    if _due is not None and time.monotonic() >= _due:
        raise SoftTimeLimitExceeded()
    logger.warning("a soft time limit arrived late, after the task it was for had ended: ignored")


def install() -> None:
    """Handle Celery's soft limit in this pool process (billiard installs its own at the process's
    start, after the worker's process-init signal, so the first step installs this one)."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGUSR1) is not _handle:
        signal.signal(signal.SIGUSR1, _handle)


@contextmanager
def due(timeout_s: float | None, *, since: float) -> Iterator[None]:
    """While in the block, the soft limit of a step with ``timeout_s`` that the pool process took at
    ``since`` (monotonic) interrupts it once due; outside, or without a timeout, it is ignored."""
    global _due
    _due = None if not timeout_s else since + timeout_s - EARLY_S
    try:
        yield
    finally:
        _due = None
