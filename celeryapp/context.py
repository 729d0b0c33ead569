"""What a step task can learn about the run it belongs to."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class StepContext:
    execution_id: int
    schedule: str
    step: str
    step_index: int
    attempt: int
    payload: dict[str, Any]
    #: The step's timeout in seconds, if it has one.
    timeout_s: float | None = None
    #: The nominal time the run is for (UTC): a cron or interval run's slot, a backfill's slot, a
    #: retry's due time; ``None`` for a manual run. A job covering "its day" reads it here.
    slot: datetime | None = None
    #: The run's random token. With ``execution_id`` it names the run even after a database that
    #: went back handed its id out again: an external system fencing writes by attempt keys them
    #: by (execution_id, run_token, step), not by the id alone. 0 for runs started before it existed.
    run_token: int = 0


_current: ContextVar[StepContext | None] = ContextVar("chordbeat_step", default=None)


def current_step() -> StepContext | None:
    """The step being run in this thread, or ``None`` outside a chordbeat step."""
    return _current.get()


@contextmanager
def running_step(context: StepContext) -> Iterator[None]:
    """Make ``context`` the current step for the duration of the block (used by the runner)."""
    token = _current.set(context)
    try:
        yield
    finally:
        _current.reset(token)
