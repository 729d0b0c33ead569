"""Runs one executable step's program; kills everything it started when it ends or its worker dies.

The worker starts this file as ``python -I -S step_supervisor.py FD PROGRAM ARGV0 [ARG...]`` in a
session of its own (``celeryapp/worker/step_kinds.py``); PROGRAM is ``/proc/self/fd/N``, the file the
worker checked, passed as descriptor N. It runs the program in a new process group and
kills that whole group (the program's children included) when either happens first:

* the program exits: whatever it left running in its group does not outlive its step;
* FD, the read end of a pipe whose only write end the worker holds, reaches end-of-file: the
  worker closed it (the step timed out or was cancelled) or the worker process died.

Why a process of its own rather than ``PR_SET_PDEATHSIG`` in the program: a pool process can be
SIGKILLed (OOM killer, hard time limit, an operator) and then runs nothing to stop its program,
which would go on beside the attempt recovery re-queues. PDEATHSIG reaches only the one process it
is set on, not the children it starts, and fires when the *thread* that forked ends, not the
process. The kernel closes a dead process's pipe ends however it died, and this small process is
not the program, so it survives to act on it. A program that moves itself into another process
group or session (a daemon) escapes; that is documented.

Standard library only: it runs isolated, without the project or the worker's environment.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

#: Exit status when the program cannot be started, as a shell reports "command not found".
CANNOT_START = 127
#: Signals Python ignores at start-up; the program gets their default behaviour back.
RESTORED_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _watch(fd: int, pgid: int) -> None:
    """Kill the program's group and leave once the worker's end of the pipe is closed."""
    while True:
        try:
            if not os.read(fd, 64):
                break
        except OSError:
            break
    _kill_group(pgid)
    os._exit(signal.SIGKILL + 128)


def main(argv: list[str]) -> int:
    fd, program, args = int(argv[1]), argv[2], argv[3:]
    os.set_inheritable(fd, False)  # the program must not keep the worker's pipe open
    try:
        # setpgroup=0: the program leads a new group, which its children join.
        pid = os.posix_spawn(program, args, os.environ, setpgroup=0, setsigdef=RESTORED_SIGNALS)
    except OSError as exc:
        sys.stderr.write(f"cannot start {args[0]!r}: {exc.strerror}\n")
        return CANNOT_START
    threading.Thread(target=_watch, args=(fd, pid), daemon=True).start()
    # Wait without reaping: the zombie keeps the group id from being reused until the group is
    # killed. Only then collect the status.
    while True:
        try:
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
            break
        except ChildProcessError:
            break
    _kill_group(pid)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        # Die the same way, so the worker sees the program's signal as its own return code.
        number = os.WTERMSIG(status)
        signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
        return 128 + number
    return os.WEXITSTATUS(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
