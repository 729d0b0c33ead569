"""A stalled beat ends itself, so that whatever supervises it starts a new one.

Beat is one loop in one thread. A call that never returns (a socket waiting on a Redis that went
away mid-reply, a lock taken in a library) stops every schedule, and a process that hangs is
restarted by nothing but Kubernetes' liveness probe: systemd, Compose and ``make run`` restart a
process only when it exits. So beat feeds this watchdog each time its loop comes round; a stall
of ``stall_s`` (the same limit after which ``chordbeat health beat`` reports it) writes every
thread's stack to stderr (what hung, for the bug report) and exits with status 1.

:mod:`faulthandler` does the waiting in a C thread of its own: it needs neither the GIL nor the
stalled loop, and feeding it costs next to nothing.
"""

from __future__ import annotations

import faulthandler
import sys
import threading
from typing import TextIO


class StallWatchdog:
    """Exits the process unless :meth:`feed` is called at least once every ``stall_s`` seconds.

    One per process: :mod:`faulthandler` has a single delayed dump, so it is armed only for a
    beat running in the main thread, never for one embedded in a worker (``worker -B``).
    """

    def __init__(self, stall_s: float, stream: TextIO | None = None) -> None:
        self.stall_s = stall_s
        # The real stderr: Celery may have swapped sys.stderr for a logging proxy without a fileno.
        self.stream = stream if stream is not None else sys.__stderr__
        self.armed = False

    def arm(self) -> bool:
        """Start watching; ``False`` (and nothing armed) outside the main thread or without a
        usable stderr (closed, or without a file descriptor): an unwatched beat still schedules."""
        if self.stream is None or threading.current_thread() is not threading.main_thread():
            return False
        try:
            faulthandler.dump_traceback_later(self.stall_s, exit=True, file=self.stream)
        except (ValueError, OSError, AttributeError):
            return False
        self.armed = True
        return True

    def feed(self) -> None:
        if self.armed and self.stream is not None:
            faulthandler.dump_traceback_later(self.stall_s, exit=True, file=self.stream)

    def disarm(self) -> None:
        if self.armed:
            self.armed = False
            faulthandler.cancel_dump_traceback_later()
