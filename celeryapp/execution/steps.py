"""A step attempt in the database: a runner claims it (``queued`` → ``processing``, its activity
opened) and finishes it (its activity closed, its worker task deleted).

Every state change is a compare-and-set ``UPDATE ... WHERE <expected state>``: whoever loses a
race (a redelivered message, a second callback, recovery racing a slow worker) changes nothing.
Functions here only touch the database and return the :class:`~celeryapp.execution.effects.Effects` to
send once the transaction has committed; :mod:`celeryapp.messaging.dispatch` sends them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, delete, exists, insert, select, update

from celeryapp.scheduling.definition import StepSpec
from models import ActivityStatus, ExecutionStatus, ScheduleExecution, WorkerTask, WorkerTaskStatus
from models.tables import ACTIVITIES, EXECUTIONS, WORKER_TASKS


def spec_of(execution: ScheduleExecution, task: WorkerTask) -> StepSpec:
    """The step as it was when the run started (from the execution's plan)."""
    return next(StepSpec.from_json(s) for s in execution.plan[task.step_index] if s["name"] == task.step_name)


@dataclass(frozen=True)
class Claim:
    """A step attempt a runner now owns."""

    worker_task_id: int
    attempt: int
    execution_id: int
    step_index: int
    spec: StepSpec
    activity_id: int
    schedule_name: str
    payload: dict[str, Any]


def _of_run(column: Any) -> Any:
    """A column of the claimed task's execution, read by the claim itself (no second statement)."""
    return select(column).where(EXECUTIONS.c.id == WORKER_TASKS.c.execution_id).scalar_subquery()


# The step path runs for every step of every run: its statements are Core statements on the
# tables, built once with bind parameters, and run on a bare connection (building SQLAlchemy
# expressions, and the ORM's work around each statement, cost more than executing them).
_task = WORKER_TASKS.c
_CLAIM = (
    update(WORKER_TASKS)
    .where(
        _task.id == bindparam("p_task_id"),
        _task.attempt == bindparam("p_attempt"),
        _task.status == WorkerTaskStatus.QUEUED,
        exists().where(EXECUTIONS.c.id == _task.execution_id, EXECUTIONS.c.status == ExecutionStatus.IN_PROGRESS),
    )
    .values(status=WorkerTaskStatus.PROCESSING, node=bindparam("p_node"), started_at=bindparam("p_now"))
    .returning(
        _task.execution_id,
        _task.step_index,
        _task.step_name,
        _of_run(EXECUTIONS.c.plan),
        _of_run(EXECUTIONS.c.schedule_name),
        _of_run(EXECUTIONS.c.payload),
    )
)


_OPEN_ACTIVITY = (
    insert(ACTIVITIES)
    .values(
        execution_id=bindparam("p_execution_id"),
        step_index=bindparam("p_step_index"),
        step_name=bindparam("p_step_name"),
        attempt=bindparam("p_attempt"),
        status=ActivityStatus.IN_PROGRESS,
        worker=bindparam("p_node"),
        started_at=bindparam("p_now"),
    )
    .returning(ACTIVITIES.c.id)
)


_CLOSE_ACTIVITY = (
    update(ACTIVITIES)
    .where(ACTIVITIES.c.id == bindparam("p_activity_id"), ACTIVITIES.c.status == ActivityStatus.IN_PROGRESS)
    .values(
        status=bindparam("p_outcome"),
        error=bindparam("p_error"),
        message=bindparam("p_message"),
        completed_at=bindparam("p_now"),
    )
)


_DROP_TASK = delete(WORKER_TASKS).where(
    _task.id == bindparam("p_task_id"),
    _task.attempt == bindparam("p_attempt"),
    _task.status == WorkerTaskStatus.PROCESSING,
)


def claim_step(conn: Connection, worker_task_id: int, attempt: int, *, node: str, now: datetime) -> Claim | None:
    """Move a queued attempt to ``processing`` and open its activity; ``None`` if not ours to run.

    ``None`` covers every message that must do nothing: a redelivery of an attempt already
    running or finished, an attempt fenced off by a newer one, a cancelled or finished execution.
    """
    claimed = conn.execute(
        _CLAIM, {"p_task_id": worker_task_id, "p_attempt": attempt, "p_node": node, "p_now": now}
    ).first()
    if claimed is None:
        return None
    execution_id, step_index, step_name, plan, schedule_name, payload = claimed
    spec = next(StepSpec.from_json(s) for s in plan[step_index] if s["name"] == step_name)
    activity_id = conn.execute(
        _OPEN_ACTIVITY,
        {
            "p_execution_id": execution_id,
            "p_step_index": step_index,
            "p_step_name": step_name,
            "p_attempt": attempt,
            "p_node": node,
            "p_now": now,
        },
    ).scalar_one()
    return Claim(worker_task_id, attempt, execution_id, step_index, spec, activity_id, schedule_name, dict(payload))


def finish_step(
    conn: Connection,
    claim: Claim,
    status: ActivityStatus,
    *,
    now: datetime,
    error: str | None = None,
    message: str | None = None,
) -> bool:
    """Record an attempt's outcome and delete its worker task; False if it was fenced meanwhile."""
    closed = conn.execute(
        _CLOSE_ACTIVITY,
        {"p_activity_id": claim.activity_id, "p_outcome": status, "p_error": error, "p_message": message, "p_now": now},
    )
    conn.execute(_DROP_TASK, {"p_task_id": claim.worker_task_id, "p_attempt": claim.attempt})
    return bool(closed.rowcount)
