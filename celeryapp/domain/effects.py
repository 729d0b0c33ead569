"""What a change in the database leaves to do once its transaction commits: chords to send,
runs to stop, beat entries to rewrite. :mod:`celeryapp.worker.dispatch` does it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from celeryapp.domain.definition import StepSpec
from celeryapp.domain.names import runner_task_id


@dataclass(frozen=True)
class StepDispatch:
    execution_id: int
    worker_task_id: int
    attempt: int
    spec: StepSpec
    #: The run's token (it names the run's keys and task ids with its id).
    token: int

    @property
    def celery_task_id(self) -> str:
        return runner_task_id(self.execution_id, self.worker_task_id, self.attempt, self.token)


@dataclass(frozen=True)
class GroupDispatch:
    """A step group to send as one chord (or, for re-queued attempts, as linked single tasks)."""

    execution_id: int
    step_index: int
    steps: tuple[StepDispatch, ...]
    #: True for re-queued attempts: sent without a chord, each linked to the advancement.
    requeue: bool = False
    #: For monitors: a step's runner is shown as ``<schedule>/<step>``.
    schedule_name: str = ""


@dataclass(frozen=True)
class LimitWake:
    """A pass over shared limits due at ``at`` (reference clock): a waiter held back only by a
    rate gets its token then, or a pass could not lock a limit a waiter also needs."""

    limit_ids: tuple[int, ...]
    at: datetime


@dataclass
class Effects:
    """What to do after commit: chords to send, executions whose running steps must stop."""

    dispatch: list[GroupDispatch] = field(default_factory=list)
    #: Cancelled runs (execution id, token): their running steps must stop.
    cancelled: list[tuple[int, int]] = field(default_factory=list)
    #: Schedules whose beat entry must be rewritten (retry due, done, dead).
    resync: list[str] = field(default_factory=list)
    #: Attempts given up by recovery (worker task id, attempt, run token): if still running
    #: anywhere, they stop.
    fenced: list[tuple[int, int, int]] = field(default_factory=list)
    #: Slots skipped because the schedule's previous run is still active (counted for overload).
    skipped_overlap: int = 0
    #: Executions this transaction ended (completed, failed, cancelled).
    ended: list[int] = field(default_factory=list)
    #: Passes over shared limits to run later (a message with a countdown, deduplicated).
    limit_wakes: list[LimitWake] = field(default_factory=list)

    def merge(self, other: Effects) -> Effects:
        self.dispatch += other.dispatch
        self.cancelled += other.cancelled
        self.resync += other.resync
        self.fenced += other.fenced
        self.skipped_overlap += other.skipped_overlap
        self.ended += other.ended
        self.limit_wakes += other.limit_wakes
        return self
