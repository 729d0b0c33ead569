"""After a step group: the execution fails, moves to its next group, or completes
(:func:`celeryapp.domain.decisions.decide_after_group` decides).

Every change is a compare-and-set; its effects are sent after commit (docs/architecture.md "Compare-and-set").
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from functools import partial
from typing import Any, NamedTuple

from sqlalchemy import JSON, Connection, and_, bindparam, func, select, update
from sqlalchemy.orm import Session

from celeryapp.domain.decisions import GroupOutcome, StepResult, Verdict, decide_after_group
from celeryapp.domain.definition import StepSpec
from celeryapp.domain.effects import Effects, GroupDispatch, StepDispatch
from celeryapp.execution.driver_sql import DriverStatement
from celeryapp.execution.limit_steps import gate_group, plan_uses_limits
from celeryapp.execution.runs import finish_execution
from models import ActivityStatus, ExecutionStatus, ScheduleExecution, WorkerTaskStatus
from models.session import autocommit, connection, retrying, transaction
from models.tables import ACTIVITIES, EXECUTIONS, WORKER_TASKS

# Every group of every run is advanced: like the step path, the statements are Core statements
# built once (three a group, the same whatever its width; two on PostgreSQL, sent to the driver
# as the step path's are, and one when the group's last outcome read the group), and the ORM is
# only used to finish a run.
_run, _task, _activity = EXECUTIONS.c, WORKER_TASKS.c, ACTIVITIES.c
_AT_GROUP = (
    _run.id == bindparam("p_execution_id"),
    _run.status == ExecutionStatus.IN_PROGRESS,
    _run.current_step_index == bindparam("p_step_index"),
)
_OF_GROUP = (_task.execution_id == bindparam("p_execution_id"), _task.step_index == bindparam("p_step_index"))
#: The run, if still at this group, with how many of the group's attempts have not finished and
#: its outcomes so far, in one statement: a row per activity (or one row without any), each with
#: this group's and the next group's steps from the plan (not the whole plan; past the last
#: group, the next one is NULL).
_READ_GROUP = (
    select(
        _run.plan[bindparam("p_group", type_=JSON.JSONIntIndexType)],
        _run.plan[bindparam("p_next_group", type_=JSON.JSONIntIndexType)],
        _run.schedule_name,
        select(func.count()).select_from(WORKER_TASKS).where(*_OF_GROUP).scalar_subquery(),
        _run.token,
        _activity.step_name,
        _activity.status,
        _activity.error,
    )
    .select_from(
        EXECUTIONS.outerjoin(
            ACTIVITIES, and_(_activity.execution_id == _run.id, _activity.step_index == bindparam("p_step_index"))
        )
    )
    .where(*_AT_GROUP)
    .order_by(_activity.attempt)
)
#: The same read within the statement that records the group's last outcome (steps.py), whose
#: snapshot still has that attempt's activity open: it leaves that activity out (its outcome is
#: the one being written) and keeps the attempt order for the latest outcome of each step.
GROUP_BUT_ONE = (
    select(
        _run.plan[bindparam("p_group", type_=JSON.JSONIntIndexType)].label("group_steps"),
        _run.plan[bindparam("p_next_group", type_=JSON.JSONIntIndexType)].label("next_steps"),
        _run.schedule_name,
        _run.token,
        _activity.step_name,
        _activity.status,
        _activity.error,
        _activity.attempt,
    )
    .select_from(
        EXECUTIONS.outerjoin(
            ACTIVITIES,
            and_(
                _activity.execution_id == _run.id,
                _activity.step_index == bindparam("p_step_index"),
                _activity.id != bindparam("p_activity_id"),
            ),
        )
    )
    .where(*_AT_GROUP)
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


def _queue_next_in_one_statement() -> Any:
    # The next group's attempts are queued only if the compare-and-set moved the run on: each
    # data-modifying CTE runs once, and the second reads what the first returned.
    moved = _MOVE_ON.returning(_run.id).cte("moved")
    return (
        update(WORKER_TASKS)
        .where(
            _task.execution_id.in_(select(moved.c.id)),
            _task.step_index == bindparam("p_step_index") + 1,
            _task.status == WorkerTaskStatus.WAITING,
        )
        .values(status=WorkerTaskStatus.QUEUED, queued_at=bindparam("p_now"))
        .returning(_task.id, _task.attempt, _task.step_name)
    )


_MOVE_ON_IN_ONE_STATEMENT = DriverStatement(_queue_next_in_one_statement())
#: On PostgreSQL the read goes to the driver too (the chord's body reads every group, the end of a run reads its last).
_READ_GROUP_BY_DRIVER = DriverStatement(_READ_GROUP)


class GroupState(NamedTuple):
    """A run still at a group, as its advancement reads it."""

    #: This group's steps and the next group's (None after the last), as the run's plan has them.
    group: list[dict[str, Any]]
    next_group: list[dict[str, Any]] | None
    schedule_name: str
    #: The group's attempts not finished (queued or processing).
    unfinished: int
    #: The latest attempt's outcome of each step that recorded one.
    results: dict[str, StepResult]
    #: The run's token (it names the next group's keys and task ids).
    token: int = 0

    def outcome(self) -> GroupOutcome:
        steps = [StepSpec.from_json(s) for s in self.group]
        has_next = self.next_group is not None
        return decide_after_group(steps, self.results, unfinished=self.unfinished, has_next_group=has_next)


def read_group(conn: Connection, execution_id: int, step_index: int) -> GroupState | None:
    """The run if it is still at this group (``None``: finished, cancelled, or already past it)."""
    params = {
        "p_execution_id": execution_id,
        "p_step_index": step_index,
        "p_group": step_index,
        "p_next_group": step_index + 1,
    }
    if conn.dialect.name == "postgresql":
        rows = _READ_GROUP_BY_DRIVER.run(conn, params).fetchall()
    else:
        rows = conn.execute(_READ_GROUP, params).all()
    if not rows:
        return None
    group, next_group, schedule_name, unfinished, token = rows[0][:5]
    # The driver gives the status's stored value, SQLAlchemy the member: either makes the member.
    results = {name: StepResult(ActivityStatus(status), error) for *_, name, status, error in rows if name is not None}
    return GroupState(group, next_group, schedule_name, unfinished, results, token)


def group_after_outcome(rows: Sequence[Sequence[Any]], step_name: str, result: StepResult) -> GroupState | None:
    """The state :func:`read_group` would read just after ``step_name``'s outcome ``result``, the
    group's last, was committed, from the rows of :data:`GROUP_BUT_ONE` its recording statement
    returned (in attempt order); ``None`` when the run was no longer at the group."""
    group, next_group, schedule_name, token = rows[0][:4]
    if schedule_name is None:
        return None
    results = {name: StepResult(ActivityStatus(status), error) for *_, name, status, error in rows if name is not None}
    results[step_name] = result
    return GroupState(group, next_group, schedule_name, 0, results, token)


def move_on(conn: Connection, execution_id: int, step_index: int, state: GroupState, *, now: datetime) -> Effects:
    """Compare-and-set the run to its next group and queue that group's attempts; nothing if the
    run is no longer at this group (someone else advanced, cancelled or ended it)."""
    params = {"p_execution_id": execution_id, "p_step_index": step_index, "p_now": now}
    if conn.dialect.name == "postgresql":
        queued = sorted(_MOVE_ON_IN_ONE_STATEMENT.run(conn, params).fetchall())
        if not queued:
            return Effects()
    else:
        if not conn.execute(_MOVE_ON, params).rowcount:
            return Effects()
        queued = sorted(conn.execute(_QUEUE_NEXT, params).all())
    assert state.next_group is not None  # only a group with a next one moves on
    specs = {s["name"]: StepSpec.from_json(s) for s in state.next_group}
    steps = tuple(StepDispatch(execution_id, i, a, specs[n], state.token) for i, a, n in queued)
    group = GroupDispatch(execution_id, step_index + 1, steps, schedule_name=state.schedule_name)
    # Steps that use shared limits take their slots here (``conn`` is then in a transaction).
    return gate_group(conn, group, now=now)


def advance_execution(session: Session, execution_id: int, step_index: int, *, now: datetime) -> Effects:
    """The activity-based check after a group: fail, advance to the next group, or complete."""
    conn = session.connection()
    state = read_group(conn, execution_id, step_index)
    if state is None:
        return Effects()
    outcome = state.outcome()
    if outcome.verdict is Verdict.WAIT:
        return Effects()
    if outcome.verdict is Verdict.ADVANCE:
        return move_on(conn, execution_id, step_index, state, now=now)
    # Ending a run is once per run: the ORM's bookkeeping (counters, retries, repeats) is worth it there.
    execution = session.get_one(ScheduleExecution, execution_id)
    guard = (
        ScheduleExecution.id == execution_id,
        ScheduleExecution.status == ExecutionStatus.IN_PROGRESS,
        ScheduleExecution.current_step_index == step_index,
    )
    status = ExecutionStatus.FAILED if outcome.verdict is Verdict.FAIL else ExecutionStatus.COMPLETED
    return finish_execution(session, execution, guard, status, error=outcome.error, now=now) or Effects()


def advance_group(
    url: str, execution_id: int, step_index: int, *, now: datetime, state: GroupState | None = None
) -> Effects:
    """:func:`advance_execution` for the paths every group takes (its last step, its chord's body),
    without a transaction around the whole; run again whole if the database aborted a part to
    break a deadlock (each part is a compare-and-set, right to run again).

    The read needs none: what it reads of a finished group no longer changes (no attempt of it is
    left, activities are immutable), and the compare-and-set checks again that the run is still
    at the group. On PostgreSQL the read is one statement and moving on one, each committing by
    itself: 2 round trips instead of 6. On SQLite the read does not wait for the write lock, so a
    chord's body that finds the run already past its group does not queue behind every writer.
    Ending the run, once per run, takes a transaction (and reads the group again in it).

    ``state``: the group as the last step's recording statement returned it (no read then; the
    compare-and-set still checks the run is at the group).
    """
    return retrying(
        f"advancing execution {execution_id} after group {step_index}",
        partial(_advance_group, url, execution_id, step_index, now=now, known=state),
    )


def _advance_group(url: str, execution_id: int, step_index: int, *, now: datetime, known: GroupState | None) -> Effects:
    state = known
    if state is None:
        with autocommit(url, read_only=True) as conn:
            state = read_group(conn, execution_id, step_index)
    if state is None:
        return Effects()
    verdict = state.outcome().verdict
    if verdict is Verdict.WAIT:
        return Effects()
    if verdict is Verdict.ADVANCE:
        # A next group that uses shared limits locks them: a transaction, not a statement alone.
        uses_limits = state.next_group is not None and plan_uses_limits([state.next_group])
        with connection(url) if uses_limits else autocommit(url) as conn:
            return move_on(conn, execution_id, step_index, state, now=now)
    with transaction(url) as session:
        return advance_execution(session, execution_id, step_index, now=now)
