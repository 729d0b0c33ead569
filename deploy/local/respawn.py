"""Run a command, and again whenever it exits, until told to stop (each ``make run`` process).

honcho stops every process as soon as one exits; wrapped in this, a process that dies (a
SIGKILLed worker, a crash) is started again after a short backoff and the others keep running.
SIGTERM, SIGINT or SIGHUP ends the loop; the command gets it too (passed on if it did not).

    python deploy/local/respawn.py celery -A celeryapp worker -l INFO
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from types import FrameType

#: Seconds before the first restart; doubled after each quick death, up to the maximum.
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 10.0
#: A run at least this long counts as healthy: the next death restarts after the first backoff.
STABLE_AFTER_S = 30.0
#: Seconds a child asked to stop may take before the signal is passed on to it directly.
FORWARD_AFTER_S = 2.0


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: respawn.py COMMAND [ARG...]", file=sys.stderr)
        return 2
    stop_signal: int | None = None

    def stop(signum: int, _frame: FrameType | None) -> None:
        nonlocal stop_signal
        stop_signal = signum

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, stop)
    backoff_s = FIRST_BACKOFF_S
    while stop_signal is None:
        started = time.monotonic()
        child = subprocess.Popen(argv)
        status = _wait(child, lambda: stop_signal)
        if stop_signal is not None:
            return 0
        if time.monotonic() - started >= STABLE_AFTER_S:
            backoff_s = FIRST_BACKOFF_S
        print(f"respawn: {argv[0]} exited with status {status}; starting it again in {backoff_s:g}s", flush=True)
        deadline = time.monotonic() + backoff_s
        while stop_signal is None and time.monotonic() < deadline:
            time.sleep(0.1)
        backoff_s = min(backoff_s * 2, MAX_BACKOFF_S)
    return 0


def _wait(child: subprocess.Popen[bytes], stop_signal: Callable[[], int | None]) -> int:
    """The child's exit status. Asked to stop, it normally got the signal with us (honcho signals
    the whole process group); only one still running after a grace period is sent it again."""
    stopping_since: float | None = None
    while True:
        try:
            return child.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            pass
        signum = stop_signal()
        if signum is None:
            continue
        if stopping_since is None:
            stopping_since = time.monotonic()
        elif time.monotonic() - stopping_since > FORWARD_AFTER_S:
            child.send_signal(signum)
            stopping_since = float("inf")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
