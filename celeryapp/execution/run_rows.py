"""The rows a run is made of: its execution row (inserted ignoring unique conflicts, which a
redelivered start or a second active run of an exclusive schedule causes), all its worker tasks
up front, and the first group to send once they are committed."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from celeryapp.domain.definition import ScheduleDefinition, StepSpec
from celeryapp.domain.effects import Effects, GroupDispatch, StepDispatch
from celeryapp.execution.limit_steps import gate_group
from models import ExecutionStatus, Overlap, Schedule, ScheduleExecution, Trigger, WorkerTaskStatus
from models.tables import EXECUTIONS, WORKER_TASKS, run_token

logger = logging.getLogger(__name__)


@dataclass
class StartResult:
    """A start's answer: the run made (or the one its run key made before), or why none was."""

    execution_id: int | None
    skipped: str | None = None
    effects: Effects = field(default_factory=Effects)


#: Step groups: what a run executes, from a definition or a stored plan.
Groups = Sequence[Sequence[StepSpec]]


@dataclass(frozen=True)
class Rerun:
    """A run again of an ended one: its stored plan and payload, from group ``from_group`` on;
    ``plan`` is that of definition ``version`` (the source's own, or the current one)."""

    of: int
    from_group: int
    plan: list[list[dict[str, Any]]]
    payload: dict[str, Any]
    version: int | None

    @property
    def groups(self) -> Groups:
        return [[StepSpec.from_json(step) for step in group] for group in self.plan]

    def row(self) -> dict[str, Any]:
        """What an execution row of the re-run holds instead of the schedule's current definition."""
        return {
            "plan": self.plan,
            # The steps it runs: a list's count of a re-run is not held back by groups it skips.
            "step_count": sum(len(group) for group in self.plan[self.from_group :]),
            "payload": self.payload,
            "current_step_index": self.from_group,
            "rerun_of": self.of,
            "rerun_from_group": self.from_group,
            "version": self.version,
        }


def execution_with_key(session: Session, run_key: str) -> int | None:
    """The execution a run key already made, if any."""
    return session.scalar(select(ScheduleExecution.id).where(ScheduleExecution.run_key == run_key))


def insert_ignoring_conflicts(session: Session) -> Any:
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    return dialect.insert(EXECUTIONS).on_conflict_do_nothing()


def execution_row(
    schedule: Schedule,
    definition: ScheduleDefinition,
    *,
    trigger: Trigger,
    run_key: str,
    now: datetime,
    payload: dict[str, Any] | None = None,
    rerun: Rerun | None = None,
    slot: datetime | None = None,
    backfill_id: int | None = None,
    version: int | None = None,
) -> dict[str, Any]:
    """``slot``: the nominal time the run is for (None for a manual run); ``backfill_id``: the
    backfill (or catch-up) that starts it; ``version``: ``definition``'s, when it is not the
    schedule's current one."""
    plan = definition.plan()
    row = {
        "schedule_id": schedule.id,
        "schedule_name": schedule.name,
        "status": ExecutionStatus.IN_PROGRESS,
        "trigger": trigger,
        "run_key": run_key,
        "exclusive_key": None if schedule.overlap is Overlap.ALLOW else schedule.id,
        "current_step_index": 0,
        "plan": plan,
        "step_count": sum(len(group) for group in plan),
        "payload": {**definition.payload, **(payload or {})},
        "started_at": now,
        "slot": slot,
        "backfill_id": backfill_id,
        "token": run_token(),
        # Pinned: the plan above is this version's, whatever the schedule becomes meanwhile.
        "version": schedule.version if version is None else version,
        "deadline_at": now + timedelta(seconds=definition.timeout_s) if definition.timeout_s else None,
    }
    return row if rerun is None else {**row, **rerun.row()}


def insert_worker_tasks(
    session: Session, executions: Mapping[int, Groups], *, now: datetime, start_group: int = 0
) -> dict[int, dict[str, int]]:
    """Every worker task of the executions from group ``start_group`` on (a re-run skips the groups
    its source completed); their ids by execution and step name (unique within a
    schedule). An executemany: SQLAlchemy sends it as multi-row INSERTs of at most 1,000 rows
    (SQLite allows 32,766 parameters a statement, PostgreSQL 65,535), compiled once."""
    steps = [
        (execution_id, index, step.name)
        for execution_id, groups in executions.items()
        for index, group in enumerate(groups)
        if index >= start_group
        for step in group
    ]
    rows = [
        {
            "execution_id": execution_id,
            "step_index": index,
            "step_name": name,
            "status": WorkerTaskStatus.QUEUED if index == start_group else WorkerTaskStatus.WAITING,
            "attempt": 1,
            "queued_at": now if index == start_group else None,
        }
        for execution_id, index, name in steps
    ]
    task_ids: dict[int, dict[str, int]] = {execution_id: {} for execution_id in executions}
    for execution_id, name, task_id in session.connection().execute(_INSERT_WORKER_TASKS, rows):
        task_ids[execution_id][name] = task_id
    return task_ids


_INSERT_WORKER_TASKS = insert(WORKER_TASKS).returning(
    WORKER_TASKS.c.execution_id, WORKER_TASKS.c.step_name, WORKER_TASKS.c.id
)


def first_group(
    session: Session,
    schedule: Schedule,
    groups: Groups,
    execution_id: int,
    row: Mapping[str, Any],
    task_ids: dict[str, int],
    trigger: Trigger,
    start_group: int = 0,
) -> Effects:
    """What to send of the run (``row``: its execution row as inserted) once committed: its
    first group's steps that may run (those that use shared limits take their slots here, or
    wait: limit_steps.py)."""
    logger.info("execution %s of schedule %r started (%s)", execution_id, schedule.name, trigger.value)
    token = row["token"]
    first = [StepDispatch(execution_id, task_ids[step.name], 1, step, token) for step in groups[start_group]]
    group = GroupDispatch(execution_id, start_group, tuple(first), schedule_name=schedule.name)
    return gate_group(session, group, now=row["started_at"])
