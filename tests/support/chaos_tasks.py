"""The chaos suite's step task: records every start and end of its body in a step log.

Loaded by the subprocess workers through ``CHORDBEAT_TASK_MODULES=tests.support.chaos_tasks``. Each line
of the log is one JSON object ``{"event": "start"|"end", "execution_id", "schedule", "step", "attempt",
"pid", "ppid", "t"}`` (``t`` is epoch seconds of the reference clock: the chaos plan steps hosts'
clocks, and the harness compares times written by different processes; ``ppid`` is the worker's main process,
which is what the harness kills; ``end`` also says how the body ended). Lines are written with
one ``write`` on an ``O_APPEND`` descriptor and fsynced, so lines of concurrent workers never
interleave and a line written before a SIGKILL is on disk.

Wherever an interrupt lands in the body (the watch's, Celery's soft time limit, or both), a
``start`` line that was written is followed by an ``end`` line: only a dead worker leaves a start
without an end. An interrupt landing before the start line was written may leave an ``end``
alone, which the harness ignores.

How long a body sleeps and whether it fails is a hash of (seed, execution, step, attempt): the
same attempt behaves the same way wherever it runs.
"""

from __future__ import annotations

import faulthandler
import hashlib
import json
import os
import signal
import sys
import time
from typing import Any

from celeryapp import app
from celeryapp.clock import clock
from celeryapp.context import StepContext, current_step

STEP_TASK = "chordbeat_chaos.step"
#: Sent by the harness to a pool process that logged a start and no end by the end of a plan: every
#: thread's stack goes to the worker's log (the original stderr: Celery replaces ``sys.stderr``),
#: so a report says where a body that did not end stood, or that its process was gone.
DUMP_STACKS = signal.SIGRTMIN + 1
faulthandler.register(DUMP_STACKS, file=sys.__stderr__, all_threads=True)


class ChaosStepFailed(Exception):
    """The step failed on purpose (its seeded hash fell under ``fail_rate``)."""


def draw(seed: int, context: StepContext, salt: str) -> float:
    """A number in [0, 1) fixed by the seed and the attempt's identity."""
    key = f"{seed}:{context.execution_id}:{context.step}:{context.attempt}:{salt}"
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64


def record(log: str, event: str, context: StepContext, **extra: Any) -> None:
    line = {
        "event": event,
        "execution_id": context.execution_id,
        "schedule": context.schedule,
        "step": context.step,
        "attempt": context.attempt,
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "t": clock.timestamp(),
        **extra,
    }
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


@app.task(name=STEP_TASK)  # type: ignore[untyped-decorator]
def step(
    log: str, seed: int = 0, sleep_min: float = 0.0, sleep_max: float = 0.5, fail_rate: float = 0.0
) -> dict[str, Any]:
    """Sleeps a seeded time in [sleep_min, sleep_max), then fails with probability ``fail_rate``."""
    context = current_step()
    if context is None:
        raise RuntimeError("chaos step called outside a chordbeat step")
    seconds = sleep_min + (sleep_max - sleep_min) * draw(seed, context, "sleep")
    fails = draw(seed, context, "fail") < fail_rate
    ended = "raised"
    try:
        # Inside the ``try``: the watch's interrupt may land as the start line's fsync returns (a
        # worker frozen there by a SIGSTOP, and stopped on waking), and its end is logged all the same.
        record(log, "start", context)
        deadline = time.monotonic() + seconds
        # Short slices: a cancel or timeout interrupt lands between them.
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.05))
        if fails:
            ended = "failed"
            raise ChaosStepFailed(f"failed on purpose after {seconds:.2f}s")
        ended = "ok"
        return {"slept": round(seconds, 3)}
    except BaseException as exc:
        if ended != "failed":
            ended = type(exc).__name__
        raise
    finally:
        # Interrupts land anywhere, this cleanup included: the watch's StepCancelled and Celery's
        # soft time limit, each once at most (both come at a step's timeout, and as a frozen worker
        # wakes). The end line is written again after each, and the last one is raised.
        try:
            record(log, "end", context, outcome=ended)
        except BaseException as interrupt:
            try:
                record(log, "end", context, outcome=type(interrupt).__name__)
            except BaseException as second:
                record(log, "end", context, outcome=type(second).__name__)
                raise
            raise
