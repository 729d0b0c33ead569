"""`make run`'s foreground process: Ctrl-C stops everything, in order, and says nothing alarming.

A terminal's Ctrl-C signals its whole foreground process group: ``make``, this, and ``tee`` in
``make run 2>&1 | tee log``. ``tee`` dying took the output with it: honcho, writing "SIGINT
received" to the closed pipe, died before stopping anything and left every process running; and
``make`` itself, interrupted, ended with "Error 130". So this moves itself into a process group of
its own and makes that the terminal's foreground group while it runs: Ctrl-C reaches this process
only, and ``make`` and ``tee`` carry on until the output ends. Then it stops the processes in
order: the apps (honcho stops workers, beat, Flower and the dashboard) first, the servers they talk
to (Redis) last, so that nothing warns on the way down about a server already gone; and exits 0,
as a stop that was asked for.

    python deploy/local/supervise.py [--server COMMAND]... -- COMMAND [ARG...]
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from types import FrameType

#: Seconds a server (Redis) may take to stop once the apps are down before it is killed.
SERVER_STOP_S = 30.0
#: Seconds the apps' supervisor may take (honcho kills what is left after 5 s of its own).
APPS_STOP_S = 60.0


@contextmanager
def terminal_foreground() -> Iterator[None]:
    """This process's own group as the terminal's foreground group, given back at the end. Only
    when it was in the foreground: a ``make run &`` in the background takes no terminal."""
    try:
        previous = os.tcgetpgrp(0) if os.isatty(0) else None
    except OSError:
        previous = None
    if previous is None or previous != os.getpgrp():
        yield
        return
    # Changing the foreground group from a group that is not (or no longer) in it stops the
    # process with SIGTTOU unless that is ignored.
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    # Ctrl-Z would stop this process alone (make, waiting for it, keeps the shell waiting too):
    # the terminal would hang with everything still running. Ignored instead.
    signal.signal(signal.SIGTSTP, signal.SIG_IGN)
    os.setpgid(0, 0)
    os.tcsetpgrp(0, os.getpgrp())
    try:
        yield
    finally:
        with suppress(OSError):  # the group that had the terminal is gone (its shell closed)
            os.tcsetpgrp(0, previous)


def start(argv: list[str]) -> subprocess.Popen[bytes]:
    """A process in a session of its own: no terminal signal reaches it, only this one's."""
    return subprocess.Popen(argv, start_new_session=True)


def stop(process: subprocess.Popen[bytes], signum: int, within_s: float) -> int:
    """Signal the process's group (a respawn wrapper and what it runs); kill it if it lingers."""
    if process.poll() is None:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signum)
    try:
        return process.wait(within_s)
    except subprocess.TimeoutExpired:
        print(f"supervise: {process.args!r} did not stop within {within_s:g} s; killing it", flush=True)
        os.killpg(process.pid, signal.SIGKILL)
        return process.wait()


def main(argv: list[str]) -> int:
    servers: list[list[str]] = []
    while argv[:1] == ["--server"] and len(argv) > 1:
        servers.append(shlex.split(argv[1]))
        argv = argv[2:]
    if argv[:1] != ["--"] or len(argv) < 2:
        print("usage: supervise.py [--server COMMAND]... -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    asked: int | None = None

    def ask(signum: int, _frame: FrameType | None) -> None:
        nonlocal asked
        asked = signum

    # Ctrl-\ too: dying of it here would leave the processes running and the terminal to no one.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, ask)
    with terminal_foreground():
        started = [start(server) for server in servers]
        apps = start(argv[1:]) if asked is None else None
        while apps is not None and asked is None and apps.poll() is None:
            time.sleep(0.1)
        status = 0
        if apps is not None:
            # honcho stops its processes on SIGINT or SIGTERM alike.
            status = stop(apps, signal.SIGTERM if asked == signal.SIGTERM else signal.SIGINT, APPS_STOP_S)
        for server in reversed(started):
            stop(server, signal.SIGTERM, SERVER_STOP_S)
    return 0 if asked is not None else status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
