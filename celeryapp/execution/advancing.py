"""After a step group: the execution fails, moves to its next group, or completes
(:func:`celeryapp.execution.decisions.decide_after_group` decides).

Every state change is a compare-and-set ``UPDATE ... WHERE <expected state>``: whoever loses a
race (a redelivered message, a second callback, recovery racing a slow worker) changes nothing.
Functions here only touch the database and return the :class:`~celeryapp.execution.effects.Effects` to
send once the transaction has committed; :mod:`celeryapp.messaging.dispatch` sends them.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, bindparam, func, select, update
from sqlalchemy.orm import Session

from celeryapp.execution.decisions import StepResult, Verdict, decide_after_group
from celeryapp.execution.effects import Effects, GroupDispatch, StepDispatch
from celeryapp.execution.runs import finish_execution
from celeryapp.scheduling.definition import StepSpec
from models import ExecutionStatus, ScheduleExecution, WorkerTaskStatus
from models.tables import ACTIVITIES, EXECUTIONS, WORKER_TASKS

# Every group of every run is advanced: like the step path, the statements are Core statements
# built once (four a group, the same whatever its width), and the ORM is only used to finish a run.
_run, _task, _activity = EXECUTIONS.c, WORKER_TASKS.c, ACTIVITIES.c
_AT_GROUP = (
    _run.id == bindparam("p_execution_id"),
    _run.status == ExecutionStatus.IN_PROGRESS,
    _run.current_step_index == bindparam("p_step_index"),
)
_OF_GROUP = (_task.execution_id == bindparam("p_execution_id"), _task.step_index == bindparam("p_step_index"))
#: The run, if still at this group, with how many of the group's attempts have not finished.
_RUN_AT_GROUP = select(
    _run.plan,
    _run.schedule_name,
    select(func.count()).select_from(WORKER_TASKS).where(*_OF_GROUP).scalar_subquery(),
).where(*_AT_GROUP)
_GROUP_RESULTS = (
    select(_activity.step_name, _activity.status, _activity.error)
    .where(_activity.execution_id == bindparam("p_execution_id"), _activity.step_index == bindparam("p_step_index"))
    .order_by(_activity.attempt)
)
_MOVE_ON = update(EXECUTIONS).where(*_AT_GROUP).values(current_step_index=bindparam("p_step_index") + 1)
_QUEUE_NEXT = (
    update(WORKER_TASKS)
    .where(
        _task.execution_id == bindparam("p_execution_id"),
        _task.step_index == bindparam("p_step_index") + 1,
        _task.status == WorkerTaskStatus.WAITING,
    )
    .values(status=WorkerTaskStatus.QUEUED, queued_at=bindparam("p_now"))
    .returning(_task.id, _task.attempt, _task.step_name)
)


_STILL_AT_GROUP = select(_run.id).where(*_AT_GROUP)


def awaits_advance(conn: Connection, execution_id: int, step_index: int) -> bool:
    """Whether the run is still at this group. The group's last step usually advances its run
    itself (``runner._advance_now``), so the chord's body mostly finds it past: one read, alone,
    before a transaction that would only read the same."""
    return (
        conn.execute(_STILL_AT_GROUP, {"p_execution_id": execution_id, "p_step_index": step_index}).first() is not None
    )


def advance_execution(session: Session, execution_id: int, step_index: int, *, now: datetime) -> Effects:
    """The activity-based check after a group: fail, advance to the next group, or complete."""
    conn = session.connection()
    where = {"p_execution_id": execution_id, "p_step_index": step_index}
    found = conn.execute(_RUN_AT_GROUP, where).first()
    if found is None:
        return Effects()  # finished, cancelled, or already past this group
    plan, schedule_name, unfinished = found
    results = {name: StepResult(status, error) for name, status, error in conn.execute(_GROUP_RESULTS, where)}
    has_next = step_index + 1 < len(plan)
    steps = [StepSpec.from_json(s) for s in plan[step_index]]
    outcome = decide_after_group(steps, results, unfinished=unfinished, has_next_group=has_next)
    if outcome.verdict is Verdict.WAIT:
        return Effects()
    if outcome.verdict is Verdict.ADVANCE:
        if not conn.execute(_MOVE_ON, where).rowcount:
            return Effects()
        queued = sorted(conn.execute(_QUEUE_NEXT, {**where, "p_now": now}).all())
        specs = {s["name"]: StepSpec.from_json(s) for s in plan[step_index + 1]}
        steps_next = tuple(StepDispatch(execution_id, i, a, specs[n]) for i, a, n in queued)
        group = GroupDispatch(execution_id, step_index + 1, steps_next, schedule_name=schedule_name)
        return Effects(dispatch=[group])
    # Ending a run is once per run: the ORM's bookkeeping (counters, retries, repeats) is worth it there.
    execution = session.get_one(ScheduleExecution, execution_id)
    guard = (
        ScheduleExecution.id == execution_id,
        ScheduleExecution.status == ExecutionStatus.IN_PROGRESS,
        ScheduleExecution.current_step_index == step_index,
    )
    status = ExecutionStatus.FAILED if outcome.verdict is Verdict.FAIL else ExecutionStatus.COMPLETED
    return finish_execution(session, execution, guard, status, error=outcome.error, now=now) or Effects()
