"""Step tasks for fault tests, loaded by subprocess workers (``CHORDBEAT_TASK_MODULES``).

Each writes what it does to the JSON-lines file named by ``log``, so a test can tell which attempt
ran when, in which process, even after that process was killed.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from celeryapp import app
from celeryapp.context import current_step


def record(log: str, event: str) -> None:
    context = current_step()
    line = {
        "event": event,
        "execution_id": context.execution_id if context else None,
        "step": context.step if context else None,
        "attempt": context.attempt if context else None,
        "pid": os.getpid(),
        "t": time.time(),
    }
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def read_log(log: str) -> list[dict[str, Any]]:
    if not os.path.exists(log):
        return []
    with open(log) as file:
        return [json.loads(line) for line in file if line.strip()]


@app.task(name="faults.tick")
def tick(log: str, seconds: float, unwind_s: float = 0.0, until: str = "") -> str:
    """Logs a tick every 0.1 s for ``seconds``, or until the file ``until`` exists; when
    interrupted, takes ``unwind_s`` to clean up."""
    record(log, "start")
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not (until and os.path.exists(until)):
            record(log, "tick")
            time.sleep(0.1)
    except BaseException:
        record(log, "interrupted")
        end = time.monotonic() + unwind_s
        while time.monotonic() < end:  # a slow cleanup: still Python code running
            time.sleep(0.05)
        record(log, "unwound")
        raise
    record(log, "end")
    return "ticked"


@app.task(name="faults.exit")
def exit_step(log: str, code: int = 3) -> None:
    """Calls ``sys.exit`` the way library code sometimes does."""
    record(log, "start")
    raise SystemExit(code)
