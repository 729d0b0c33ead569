"""A step attempt in the database: a runner claims it (``queued`` → ``processing``, its activity
opened) and finishes it (its activity closed, its worker task deleted).

Every change is a compare-and-set; its effects are sent after commit (docs/architecture.md "Compare-and-set").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

from sqlalchemy import (
    JSON,
    Connection,
    and_,
    bindparam,
    delete,
    exists,
    func,
    insert,
    literal,
    select,
    true,
    type_coerce,
    update,
)

from celeryapp.domain.decisions import StepResult
from celeryapp.domain.definition import StepSpec
from celeryapp.execution.advancing import GROUP_BUT_ONE, GroupState, group_after_outcome
from celeryapp.execution.driver_sql import DriverStatement
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
    #: The run's nominal time (UTC), ``None`` for a manual run.
    slot: datetime | None = None
    #: The run's token: its keys are named with it (keys.py), and its outcome closes only its own
    #: activity (ids a database that went back hands out again belong to other runs).
    token: int = 0


def _of_run(column: Any) -> Any:
    """A column of the claimed task's execution, read by the claim itself (no second statement)."""
    return select(column).where(EXECUTIONS.c.id == WORKER_TASKS.c.execution_id).scalar_subquery()


# A claim reads its step's group from the run's plan, not the whole plan: a plan grows with its
# schedule (up to 256 KB), and was sent and parsed for every step of the run.
#: SQLite's form (PostgreSQL claims in one statement, below): a JSON path built from the index.
_GROUP_OF_PLAN = type_coerce(
    func.json_extract(EXECUTIONS.c.plan, func.printf("$[%d]", WORKER_TASKS.c.step_index)), JSON
)


# The step path runs for every step of every run: its statements are Core statements on the
# tables, built once with bind parameters, and run on a bare connection (building SQLAlchemy
# expressions, and the ORM's work around each statement, cost more than executing them).
#
# On PostgreSQL the claim and the outcome are one statement each (data-modifying CTEs). The
# outcome is sent alone, committing by itself (``models.session.autocommit``); the claim
# stays in a transaction, so that it commits only if its runner is still there to ask (see
# ``runner._claim``). 4 round trips to the server a step instead of 8 (what that saves:
# docs/performance.md). SQLite has no data-modifying CTEs; it runs the same changes as two
# statements in a transaction, which cost no round trips there.
_task = WORKER_TASKS.c
#: The run, still in progress, locked FOR KEY SHARE before the worker task is (the lock order,
#: docs/architecture.md "Locks"): the lock the activity's foreign key takes anyway, taken first.
#: Taken after the task's, it waited on a run being cancelled, whose cancel waited on the task.
_RUN_IN_PROGRESS = exists(
    select(EXECUTIONS.c.id)
    .where(EXECUTIONS.c.id == _task.execution_id, EXECUTIONS.c.status == ExecutionStatus.IN_PROGRESS)
    .with_for_update(read=True, key_share=True)
)
_CLAIMABLE = (
    _task.id == bindparam("p_task_id"),
    _task.attempt == bindparam("p_attempt"),
    _task.status == WorkerTaskStatus.QUEUED,
    _RUN_IN_PROGRESS,
)
_TO_PROCESSING = {"status": WorkerTaskStatus.PROCESSING, "node": bindparam("p_node"), "started_at": bindparam("p_now")}
_CLAIM = (
    update(WORKER_TASKS)
    .where(*_CLAIMABLE)
    .values(_TO_PROCESSING)
    .returning(
        _task.execution_id,
        _task.step_index,
        _task.step_name,
        _of_run(_GROUP_OF_PLAN),
        _of_run(EXECUTIONS.c.schedule_name),
        _of_run(EXECUTIONS.c.payload),
        _of_run(EXECUTIONS.c.slot),
        _of_run(EXECUTIONS.c.token),
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


def _claim_in_one_statement() -> Any:
    claimed = (
        update(WORKER_TASKS)
        .where(*_CLAIMABLE)
        .values(_TO_PROCESSING)
        .returning(_task.execution_id, _task.step_index, _task.step_name)
        .cte("claimed")
    )
    opened = (
        insert(ACTIVITIES)
        .from_select(
            ["execution_id", "step_index", "step_name", "attempt", "status", "worker", "started_at"],
            select(
                claimed.c.execution_id,
                claimed.c.step_index,
                claimed.c.step_name,
                bindparam("p_attempt", type_=ACTIVITIES.c.attempt.type),
                literal(ActivityStatus.IN_PROGRESS, ACTIVITIES.c.status.type),
                bindparam("p_node", type_=ACTIVITIES.c.worker.type),
                bindparam("p_now", type_=ACTIVITIES.c.started_at.type),
            ),
        )
        .returning(ACTIVITIES.c.id, ACTIVITIES.c.execution_id, ACTIVITIES.c.step_index, ACTIVITIES.c.step_name)
        .cte("opened")
    )
    # The statement's snapshot holds the execution the claim checked: the join finds it.
    return select(
        opened.c.execution_id,
        opened.c.step_index,
        opened.c.step_name,
        EXECUTIONS.c.plan[opened.c.step_index],
        EXECUTIONS.c.schedule_name,
        EXECUTIONS.c.payload,
        opened.c.id,
        EXECUTIONS.c.slot,
        EXECUTIONS.c.token,
    ).join_from(opened, EXECUTIONS, EXECUTIONS.c.id == opened.c.execution_id)


_CLAIM_IN_ONE_STATEMENT = DriverStatement(_claim_in_one_statement())


#: The activity the claim opened, of the claimed run: after a database went back (its claim lost
#: with it), the id may be another run's.
_CLOSE_ACTIVITY = (
    update(ACTIVITIES)
    .where(
        ACTIVITIES.c.id == bindparam("p_activity_id"),
        ACTIVITIES.c.status == ActivityStatus.IN_PROGRESS,
        ACTIVITIES.c.execution_id == bindparam("p_execution_id"),
        exists().where(EXECUTIONS.c.id == ACTIVITIES.c.execution_id, EXECUTIONS.c.token == bindparam("p_token")),
    )
    .values(
        status=bindparam("p_outcome"),
        error=bindparam("p_error"),
        message=bindparam("p_message"),
        traceback=bindparam("p_traceback"),
        log_tail=bindparam("p_log_tail"),
        completed_at=bindparam("p_now"),
    )
)


_DROP_TASK = delete(WORKER_TASKS).where(
    _task.id == bindparam("p_task_id"),
    _task.attempt == bindparam("p_attempt"),
    _task.status == WorkerTaskStatus.PROCESSING,
)


#: The group's attempts not finished. Within the outcome's statement it still counts the attempt
#: being dropped: the parts of one statement share a snapshot and do not see each other's changes.
_GROUP_LEFT = (
    select(func.count())
    .select_from(WORKER_TASKS)
    .where(_task.execution_id == bindparam("p_execution_id"), _task.step_index == bindparam("p_step_index"))
    .scalar_subquery()
)


def _finish_in_one_statement() -> Any:
    # Each data-modifying CTE runs once and to completion whether or not the query reads it.
    # The activity's update reads the task's delete, which therefore runs (and locks the task)
    # first: worker task before activity, the lock order. PostgreSQL otherwise runs the CTEs
    # in no promised order, and activity first deadlocked with a cancel (task, then activities).
    dropped = _DROP_TASK.returning(_task.id).cte("dropped")
    after_drop = select(func.count()).select_from(dropped).scalar_subquery() >= 0
    closed = _CLOSE_ACTIVITY.where(after_drop).returning(ACTIVITIES.c.id).cte("closed")
    counts = select(
        select(func.count()).select_from(closed).scalar_subquery().label("closed"),
        select(func.count()).select_from(dropped).scalar_subquery().label("dropped"),
        _GROUP_LEFT.label("left"),
    ).subquery("counts")
    # The group's last outcome, recorded, also reads what advancing the run needs (a row per other
    # activity of the group), in the same snapshot: the read the advancement made after it, a
    # statement and a round trip, saved. Any other outcome reads nothing: in the lateral
    # subquery the condition is a one-time filter, checked before any row is read.
    last = and_(counts.c.closed > 0, counts.c.dropped > 0, counts.c.left == counts.c.dropped)
    read = GROUP_BUT_ONE.where(last).lateral("group_read")
    return (
        select(counts, *[read.c[name] for name in _READ_COLUMNS])
        .select_from(counts.outerjoin(read, true()))
        .order_by(read.c.attempt)
    )


_READ_COLUMNS = ("group_steps", "next_steps", "schedule_name", "token", "step_name", "status", "error")


_FINISH_IN_ONE_STATEMENT = DriverStatement(_finish_in_one_statement())


def _one_statement(conn: Connection) -> bool:
    return conn.dialect.name == "postgresql"


def _claim_of(worker_task_id: int, attempt: int, row: Sequence[Any], activity_id: int, slot: Any, token: int) -> Claim:
    """The claim of the attempt whose claiming statement returned ``row`` (both forms' first six columns)."""
    execution_id, step_index, step_name, group, schedule_name, payload = row[:6]
    spec = next(StepSpec.from_json(s) for s in group if s["name"] == step_name)
    return Claim(
        worker_task_id,
        attempt,
        execution_id,
        step_index,
        spec,
        activity_id,
        schedule_name,
        dict(payload),
        _utc(slot),
        token,
    )


def _utc(value: datetime | None) -> datetime | None:
    # The one-statement claim goes to the driver, bypassing the column's type: aware, any zone.
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def claim_step(conn: Connection, worker_task_id: int, attempt: int, *, node: str, now: datetime) -> Claim | None:
    """Move a queued attempt to ``processing`` and open its activity; ``None`` if not ours to run.

    ``None`` covers every message that must do nothing: a redelivery of an attempt already
    running or finished, an attempt fenced off by a newer one, a cancelled or finished execution.
    """
    params = {"p_task_id": worker_task_id, "p_attempt": attempt, "p_node": node, "p_now": now}
    if _one_statement(conn):
        row = _CLAIM_IN_ONE_STATEMENT.run(conn, params).fetchone()
        return None if row is None else _claim_of(worker_task_id, attempt, row, row[6], row[7], row[8])
    claimed = conn.execute(_CLAIM, params).first()
    if claimed is None:
        return None
    execution_id, step_index, step_name = claimed[:3]
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
    return _claim_of(worker_task_id, attempt, claimed, activity_id, claimed[6], claimed[7])


_STILL_CLAIMED = select(_task.id).where(
    _task.id == bindparam("p_task_id"),
    _task.attempt == bindparam("p_attempt"),
    _task.status == WorkerTaskStatus.PROCESSING,
    _task.node == bindparam("p_node"),
    _task.started_at == bindparam("p_now"),
)


def claim_committed(conn: Connection, claim: Claim, *, node: str, now: datetime) -> bool:
    """Whether ``claim``, made by ``node`` at ``now`` and not known to have committed (the
    connection was lost on ``COMMIT``), did: its attempt is still processing as that claim left
    it. Its runner then runs it, where claiming again finds nothing queued."""
    params = {"p_task_id": claim.worker_task_id, "p_attempt": claim.attempt, "p_node": node, "p_now": now}
    return conn.execute(_STILL_CLAIMED, params).first() is not None


class Recorded(NamedTuple):
    """What recording an outcome did."""

    #: The activity was closed (False: the attempt was fenced meanwhile, nothing changed).
    closed: bool
    #: This attempt was the last of its group left: the group can be advanced now.
    last_of_group: bool
    #: The group as the recording statement read it, when it was the last (PostgreSQL only).
    group: GroupState | None = None


def finish_step(
    conn: Connection,
    claim: Claim,
    status: ActivityStatus,
    *,
    now: datetime,
    error: str | None = None,
    message: str | None = None,
    traceback: str | None = None,
    log_tail: str | None = None,
) -> Recorded:
    """Record an attempt's outcome (with a failure's traceback and its last log lines) and delete
    its worker task."""
    outcome = {
        "p_activity_id": claim.activity_id,
        "p_outcome": status,
        "p_error": error,
        "p_message": message,
        "p_traceback": traceback,
        "p_log_tail": log_tail,
        "p_execution_id": claim.execution_id,
        "p_token": claim.token,
    }
    task = {"p_task_id": claim.worker_task_id, "p_attempt": claim.attempt}
    group = {"p_execution_id": claim.execution_id, "p_step_index": claim.step_index}
    if _one_statement(conn):
        reads = {"p_group": claim.step_index, "p_next_group": claim.step_index + 1}
        rows = _FINISH_IN_ONE_STATEMENT.run(conn, {**outcome, **task, **group, **reads, "p_now": now}).fetchall()
        closed, dropped, left = rows[0][:3]
        last = bool(dropped) and left == dropped
        if not (closed and last):
            return Recorded(bool(closed), last)
        read = [row[3:] for row in rows]
        return Recorded(True, True, group_after_outcome(read, claim.spec.name, StepResult(status, error)))
    dropped = conn.execute(_DROP_TASK, task).rowcount
    closed = conn.execute(_CLOSE_ACTIVITY, {**outcome, "p_now": now}).rowcount
    return Recorded(bool(closed), bool(dropped) and conn.execute(select(_GROUP_LEFT), group).scalar_one() == 0)


_RELEASE_TASK = (
    update(WORKER_TASKS)
    .where(
        _task.id == bindparam("p_task_id"),
        _task.attempt == bindparam("p_attempt"),
        _task.status == WorkerTaskStatus.PROCESSING,
        _task.node == bindparam("p_node"),
    )
    .values(status=WorkerTaskStatus.QUEUED, node=None, started_at=None)
)
_DROP_OPENED = delete(ACTIVITIES).where(
    ACTIVITIES.c.id == bindparam("p_activity_id"), ACTIVITIES.c.status == ActivityStatus.IN_PROGRESS
)


def release_claim(conn: Connection, claim: Claim, *, node: str) -> bool:
    """Undo a claim whose attempt turns out to run elsewhere already (the database went back and
    lost that runner's claim): queued again, the activity it opened deleted, so that the other
    runner's outcome finds nothing of it and recovery sends the attempt again once that one ended.
    Whether the claim was still there to undo."""
    params = {"p_task_id": claim.worker_task_id, "p_attempt": claim.attempt, "p_node": node}
    if not conn.execute(_RELEASE_TASK, params).rowcount:
        return False
    conn.execute(_DROP_OPENED, {"p_activity_id": claim.activity_id})
    return True


_STORED = select(ACTIVITIES.c.status, ACTIVITIES.c.error).where(ACTIVITIES.c.id == bindparam("p_activity_id"))


def stored_outcome(conn: Connection, claim: Claim) -> tuple[ActivityStatus, str | None] | None:
    """The outcome someone else recorded for the attempt (its run cancelled, recovery gave it up)
    when its own closed nothing: what monitors are told instead. ``None`` if the activity is gone
    or still open (a rare path: one statement, after a recording that changed nothing)."""
    row = conn.execute(_STORED, {"p_activity_id": claim.activity_id}).first()
    if row is None or row.status is ActivityStatus.IN_PROGRESS:
        return None
    return row.status, row.error
