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
from typing import Any, cast

from sqlalchemy import CursorResult, bindparam, delete, exists, insert, select, update
from sqlalchemy.orm import Session

from celeryapp.scheduling.definition import StepSpec
from models import Activity, ActivityStatus, ExecutionStatus, ScheduleExecution, WorkerTask, WorkerTaskStatus
from models.session import NO_SYNC


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
    return select(column).where(ScheduleExecution.id == WorkerTask.execution_id).scalar_subquery()


# The step path runs for every step of every run: its statements are built once, with bind
# parameters, instead of per call (building SQLAlchemy expressions costs more than executing them).
_CLAIM = (
    update(WorkerTask)
    .where(
        WorkerTask.id == bindparam("p_task_id"),
        WorkerTask.attempt == bindparam("p_attempt"),
        WorkerTask.status == WorkerTaskStatus.QUEUED,
        exists().where(
            ScheduleExecution.id == WorkerTask.execution_id,
            ScheduleExecution.status == ExecutionStatus.IN_PROGRESS,
        ),
    )
    .values(status=WorkerTaskStatus.PROCESSING, node=bindparam("p_node"), started_at=bindparam("p_now"))
    .returning(
        WorkerTask.execution_id,
        WorkerTask.step_index,
        WorkerTask.step_name,
        _of_run(ScheduleExecution.plan),
        _of_run(ScheduleExecution.schedule_name),
        _of_run(ScheduleExecution.payload),
    )
)


_OPEN_ACTIVITY = (
    insert(Activity)
    .values(
        execution_id=bindparam("p_execution_id"),
        step_index=bindparam("p_step_index"),
        step_name=bindparam("p_step_name"),
        attempt=bindparam("p_attempt"),
        status=ActivityStatus.IN_PROGRESS,
        worker=bindparam("p_node"),
        started_at=bindparam("p_now"),
    )
    .returning(Activity.id)
)


_CLOSE_ACTIVITY = (
    update(Activity)
    .where(Activity.id == bindparam("p_activity_id"), Activity.status == ActivityStatus.IN_PROGRESS)
    .values(
        status=bindparam("p_outcome"),
        error=bindparam("p_error"),
        message=bindparam("p_message"),
        completed_at=bindparam("p_now"),
    )
)


_DROP_TASK = delete(WorkerTask).where(
    WorkerTask.id == bindparam("p_task_id"),
    WorkerTask.attempt == bindparam("p_attempt"),
    WorkerTask.status == WorkerTaskStatus.PROCESSING,
)


def claim_step(session: Session, worker_task_id: int, attempt: int, *, node: str, now: datetime) -> Claim | None:
    """Move a queued attempt to ``processing`` and open its activity; ``None`` if not ours to run.

    ``None`` covers every message that must do nothing: a redelivery of an attempt already
    running or finished, an attempt fenced off by a newer one, a cancelled or finished execution.
    """
    claimed = session.execute(
        _CLAIM,
        {"p_task_id": worker_task_id, "p_attempt": attempt, "p_node": node, "p_now": now},
        execution_options=NO_SYNC,
    ).first()
    if claimed is None:
        return None
    execution_id, step_index, step_name, plan, schedule_name, payload = claimed
    spec = next(StepSpec.from_json(s) for s in plan[step_index] if s["name"] == step_name)
    activity_id = session.execute(
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
    session: Session,
    claim: Claim,
    status: ActivityStatus,
    *,
    now: datetime,
    error: str | None = None,
    message: str | None = None,
) -> bool:
    """Record an attempt's outcome and delete its worker task; False if it was fenced meanwhile."""
    closed = session.execute(
        _CLOSE_ACTIVITY,
        {"p_activity_id": claim.activity_id, "p_outcome": status, "p_error": error, "p_message": message, "p_now": now},
        execution_options=NO_SYNC,
    )
    session.execute(
        _DROP_TASK, {"p_task_id": claim.worker_task_id, "p_attempt": claim.attempt}, execution_options=NO_SYNC
    )
    return bool(cast(CursorResult[Any], closed).rowcount)
