"""After a step group: the execution fails, moves to its next group, or completes
(:func:`celeryapp.execution.decisions.decide_after_group` decides).

Every state change is a compare-and-set ``UPDATE ... WHERE <expected state>``: whoever loses a
race (a redelivered message, a second callback, recovery racing a slow worker) changes nothing.
Functions here only touch the database and return the :class:`~celeryapp.execution.effects.Effects` to
send once the transaction has committed; :mod:`celeryapp.messaging.dispatch` sends them.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from celeryapp.execution.decisions import StepResult, Verdict, decide_after_group
from celeryapp.execution.effects import Effects, GroupDispatch, StepDispatch
from celeryapp.execution.runs import finish_execution
from celeryapp.scheduling.definition import StepSpec
from models import Activity, ExecutionStatus, ScheduleExecution, WorkerTask, WorkerTaskStatus
from models.session import affected


def _latest_results(session: Session, execution_id: int, step_index: int) -> dict[str, StepResult]:
    rows = session.execute(
        select(Activity.step_name, Activity.status, Activity.error)
        .where(Activity.execution_id == execution_id, Activity.step_index == step_index)
        .order_by(Activity.attempt)
    ).all()
    return {name: StepResult(status, error) for name, status, error in rows}


def advance_execution(session: Session, execution_id: int, step_index: int, *, now: datetime) -> Effects:
    """The activity-based check after a group: fail, advance to the next group, or complete."""
    execution = session.get(ScheduleExecution, execution_id)
    if (
        execution is None
        or execution.status is not ExecutionStatus.IN_PROGRESS
        or execution.current_step_index != step_index
    ):
        return Effects()
    unfinished = (
        session.scalar(
            select(func.count()).where(
                WorkerTask.execution_id == execution_id,
                WorkerTask.step_index == step_index,
            )
        )
        or 0
    )
    steps = [StepSpec.from_json(s) for s in execution.plan[step_index]]
    has_next = step_index + 1 < len(execution.plan)
    outcome = decide_after_group(
        steps, _latest_results(session, execution_id, step_index), unfinished=unfinished, has_next_group=has_next
    )
    guard = (
        ScheduleExecution.id == execution_id,
        ScheduleExecution.status == ExecutionStatus.IN_PROGRESS,
        ScheduleExecution.current_step_index == step_index,
    )
    if outcome.verdict is Verdict.WAIT:
        return Effects()
    if outcome.verdict is Verdict.ADVANCE:
        moved = affected(session, update(ScheduleExecution).where(*guard).values(current_step_index=step_index + 1))
        if not moved:
            return Effects()
        session.execute(
            update(WorkerTask)
            .where(
                WorkerTask.execution_id == execution_id,
                WorkerTask.step_index == step_index + 1,
                WorkerTask.status == WorkerTaskStatus.WAITING,
            )
            .values(status=WorkerTaskStatus.QUEUED, queued_at=now)
        )
        return Effects(dispatch=[_queued_group(session, execution, step_index + 1)])
    status = ExecutionStatus.FAILED if outcome.verdict is Verdict.FAIL else ExecutionStatus.COMPLETED
    return finish_execution(session, execution, guard, status, error=outcome.error, now=now) or Effects()


def _queued_group(session: Session, execution: ScheduleExecution, step_index: int) -> GroupDispatch:
    specs = {s["name"]: StepSpec.from_json(s) for s in execution.plan[step_index]}
    tasks = session.execute(
        select(WorkerTask.id, WorkerTask.attempt, WorkerTask.step_name)
        .where(
            WorkerTask.execution_id == execution.id,
            WorkerTask.step_index == step_index,
            WorkerTask.status == WorkerTaskStatus.QUEUED,
        )
        .order_by(WorkerTask.id)
    ).all()
    return GroupDispatch(
        execution.id,
        step_index,
        tuple(StepDispatch(execution.id, i, a, specs[n]) for i, a, n in tasks),
        schedule_name=execution.schedule_name,
    )
