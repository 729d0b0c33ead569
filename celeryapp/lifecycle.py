"""Execution lifecycle in the database: start, claim and finish steps, advance, cancel.

Every state change is a compare-and-set ``UPDATE ... WHERE <expected state>``: whoever loses a
race (a redelivered message, a second callback, recovery racing a slow worker) changes nothing.
Functions here only touch the database and return what must be sent once the transaction has
committed; :mod:`celeryapp.dispatch` sends it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple, cast

from sqlalchemy import CursorResult, bindparam, delete, exists, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from celeryapp import keys
from celeryapp.decisions import (
    AfterExecution,
    NextRun,
    RetryPolicy,
    ScheduleState,
    StepResult,
    Verdict,
    decide_after_execution,
    decide_after_group,
    decide_lost_attempt,
)
from celeryapp.definition import StepSpec
from celeryapp.errors import NotFound
from celeryapp.store import definition_of
from celeryapp.views import iso
from models import (
    Activity,
    ActivityStatus,
    ExecutionStatus,
    Overlap,
    Schedule,
    ScheduleExecution,
    ScheduleStatus,
    SlotOutcome,
    SlotRecord,
    Trigger,
    WorkerTask,
    WorkerTaskStatus,
)
from models.session import affected

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepDispatch:
    execution_id: int
    worker_task_id: int
    attempt: int
    spec: StepSpec

    @property
    def celery_task_id(self) -> str:
        return keys.runner_task_id(self.execution_id, self.worker_task_id, self.attempt)


@dataclass(frozen=True)
class GroupDispatch:
    """A step group to send as one chord (or, for re-queued attempts, as linked single tasks)."""

    execution_id: int
    step_index: int
    steps: tuple[StepDispatch, ...]
    #: True for re-queued attempts: sent without a chord, each linked to the advancement.
    requeue: bool = False


@dataclass
class Effects:
    """What to do after commit: chords to send, executions whose running steps must stop."""

    dispatch: list[GroupDispatch] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)
    revoke: list[str] = field(default_factory=list)
    #: Schedules whose beat entry must be rewritten (retry due, done, dead).
    resync: list[str] = field(default_factory=list)
    #: Attempts given up by recovery (worker task id, attempt): if still running anywhere, they stop.
    fenced: list[tuple[int, int]] = field(default_factory=list)
    #: Slots skipped because the schedule's previous run is still active (counted for overload).
    skipped_overlap: int = 0
    #: Executions this transaction ended (completed, failed, cancelled).
    ended: list[int] = field(default_factory=list)

    def merge(self, other: Effects) -> Effects:
        self.dispatch += other.dispatch
        self.cancelled += other.cancelled
        self.revoke += other.revoke
        self.resync += other.resync
        self.fenced += other.fenced
        self.skipped_overlap += other.skipped_overlap
        self.ended += other.ended
        return self


@dataclass
class StartResult:
    execution_id: int | None
    skipped: str | None = None
    effects: Effects = field(default_factory=Effects)


# --- starting ---------------------------------------------------------------------------------


def run_key(name: str, trigger: Trigger, nominal_at: datetime, retry: int = 0) -> str:
    """The same slot (and retry) always gives the same key: two beats or a redelivery make one run."""
    kind = f"retry{retry}" if trigger is Trigger.RETRY else trigger.value
    return f"{name}:{kind}:{iso(nominal_at)}"


def lock_schedule(session: Session, schedule_id: int) -> None:
    """Take the schedule's row lock until commit (PostgreSQL; SQLite's writers exclude each other).

    Whatever starts or ends a run of the schedule takes it first. A fire therefore reads the
    schedule's runs only after an ending run committed (it cannot see that run as active and
    buffer a run nobody will start), and locks are always taken schedule first, then execution,
    so starts and ends cannot deadlock each other.
    """
    session.execute(select(Schedule.id).where(Schedule.id == schedule_id).with_for_update())


def _active_execution_ids(session: Session, schedule_id: int) -> list[int]:
    return list(
        session.scalars(
            select(ScheduleExecution.id)
            .where(
                ScheduleExecution.schedule_id == schedule_id,
                ScheduleExecution.status == ExecutionStatus.IN_PROGRESS,
            )
            .order_by(ScheduleExecution.id)
        )
    )


class SlotOwner(NamedTuple):
    """The schedule a slot record belongs to (what a fire reads without loading the schedule)."""

    id: int
    name: str


def record_slot(
    session: Session,
    schedule: Schedule | SlotOwner,
    outcome: SlotOutcome,
    *,
    trigger: Trigger,
    nominal_at: datetime | None,
    now: datetime,
    execution_id: int | None = None,
    detail: str | None = None,
) -> None:
    session.execute(
        insert(SlotRecord).values(
            schedule_id=schedule.id,
            schedule_name=schedule.name,
            nominal_at=nominal_at,
            trigger=trigger,
            outcome=outcome,
            execution_id=execution_id,
            detail=detail,
            recorded_at=now,
        )
    )


def start_execution(
    session: Session,
    schedule: Schedule,
    *,
    trigger: Trigger,
    run_key: str,
    now: datetime,
    payload: dict[str, Any] | None = None,
    nominal_at: datetime | None = None,
    locked_without_active: bool = False,
) -> StartResult:
    """Create an execution with all its worker tasks, honouring the schedule's overlap policy.

    ``locked_without_active``: the caller holds the schedule's row lock and found no active run.
    """
    if not locked_without_active:
        lock_schedule(session, schedule.id)
    existing = session.scalar(select(ScheduleExecution.id).where(ScheduleExecution.run_key == run_key))
    if existing is not None:
        return StartResult(existing, skipped="duplicate")
    effects = Effects()
    active = [] if locked_without_active else _active_execution_ids(session, schedule.id)
    if active and schedule.overlap is not Overlap.ALLOW:
        if schedule.overlap is Overlap.CANCEL_PREVIOUS:
            for execution_id in active:
                effects.merge(cancel_execution(session, execution_id, now=now, reason="cancelled: a new run started"))
        else:
            overlapped = _overlapped(session, schedule, active[0], trigger=trigger, nominal_at=nominal_at, now=now)
            if overlapped is not None:
                return overlapped

    definition = definition_of(schedule)
    execution = ScheduleExecution(
        schedule_id=schedule.id,
        schedule_name=schedule.name,
        status=ExecutionStatus.IN_PROGRESS,
        trigger=trigger,
        run_key=run_key,
        exclusive_key=None if schedule.overlap is Overlap.ALLOW else schedule.id,
        current_step_index=0,
        plan=definition.plan(),
        payload={**definition.payload, **(payload or {})},
        started_at=now,
        deadline_at=now + timedelta(seconds=definition.timeout_s) if definition.timeout_s else None,
    )
    try:
        with session.begin_nested():
            session.add(execution)
            session.flush()
    except IntegrityError:
        # Lost a race: the same run key, or another active run of an exclusive schedule. (Rolling
        # back the savepoint already took the new execution out of the session.)
        winner = session.scalar(select(ScheduleExecution.id).where(ScheduleExecution.run_key == run_key))
        if winner is not None:
            return StartResult(winner, skipped="duplicate")
        overlapped = _overlapped(session, schedule, None, trigger=trigger, nominal_at=nominal_at, now=now)
        return overlapped or StartResult(None, skipped="overlap: another execution is in progress")

    # Every worker task in one statement (ids come back in the rows' order).
    rows = [
        {
            "execution_id": execution.id,
            "step_index": index,
            "step_name": step.name,
            "status": WorkerTaskStatus.QUEUED if index == 0 else WorkerTaskStatus.WAITING,
            "attempt": 1,
            "queued_at": now if index == 0 else None,
        }
        for index, group in enumerate(definition.groups)
        for step in group
    ]
    task_ids = session.scalars(insert(WorkerTask).returning(WorkerTask.id, sort_by_parameter_order=True), rows).all()
    group_zero = definition.groups[0]
    first = [
        StepDispatch(execution.id, i, 1, step) for i, step in zip(task_ids[: len(group_zero)], group_zero, strict=True)
    ]
    session.execute(update(Schedule).where(Schedule.id == schedule.id).values(last_run_at=now))
    record_slot(
        session, schedule, SlotOutcome.FIRED, trigger=trigger, nominal_at=nominal_at, now=now, execution_id=execution.id
    )
    effects.dispatch.append(GroupDispatch(execution.id, 0, tuple(first)))
    logger.info("execution %s of schedule %r started (%s)", execution.id, schedule.name, trigger.value)
    return StartResult(execution.id, effects=effects)


def _overlapped(
    session: Session,
    schedule: Schedule,
    active_id: int | None,
    *,
    trigger: Trigger,
    nominal_at: datetime | None,
    now: datetime,
) -> StartResult | None:
    """Record why the run does not start; ``None`` if the active run ended meanwhile: start it."""
    running = f"execution {active_id}" if active_id is not None else "another execution"
    if trigger is Trigger.RETRY:
        # The retry stays pending: the end of the active run starts it (see _after_execution).
        detail = f"{running} is in progress; retry {schedule.current_retry} runs when it ends"
        record_slot(
            session, schedule, SlotOutcome.BUFFERED, trigger=trigger, nominal_at=nominal_at, now=now, detail=detail
        )
        logger.info("schedule %r: %s", schedule.name, detail)
        return StartResult(None, skipped=f"retry waits: {running} is in progress")
    if schedule.overlap is Overlap.BUFFER_ONE:
        still_running = exists().where(
            ScheduleExecution.schedule_id == schedule.id, ScheduleExecution.status == ExecutionStatus.IN_PROGRESS
        )
        if not affected(
            session, update(Schedule).where(Schedule.id == schedule.id, still_running).values(buffered=True)
        ):
            return None
        record_slot(
            session,
            schedule,
            SlotOutcome.BUFFERED,
            trigger=trigger,
            nominal_at=nominal_at,
            now=now,
            detail=f"{running} is in progress; runs when it ends",
        )
        logger.info("schedule %r: %s is in progress, run buffered", schedule.name, running)
        return StartResult(None, skipped=f"buffered: {running} is in progress")
    record_slot(
        session,
        schedule,
        SlotOutcome.SKIPPED_OVERLAP,
        trigger=trigger,
        nominal_at=nominal_at,
        now=now,
        detail=f"{running} is in progress",
    )
    logger.info("schedule %r: %s is still in progress, run skipped", schedule.name, running)
    return StartResult(None, skipped=f"overlap: {running} is in progress", effects=Effects(skipped_overlap=1))


# --- steps ------------------------------------------------------------------------------------


def _spec_of(execution: ScheduleExecution, task: WorkerTask) -> StepSpec:
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
_NO_SYNC = {"synchronize_session": False}


def claim_step(session: Session, worker_task_id: int, attempt: int, *, node: str, now: datetime) -> Claim | None:
    """Move a queued attempt to ``processing`` and open its activity; ``None`` if not ours to run.

    ``None`` covers every message that must do nothing: a redelivery of an attempt already
    running or finished, an attempt fenced off by a newer one, a cancelled or finished execution.
    """
    claimed = session.execute(
        _CLAIM,
        {"p_task_id": worker_task_id, "p_attempt": attempt, "p_node": node, "p_now": now},
        execution_options=_NO_SYNC,
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
        execution_options=_NO_SYNC,
    )
    session.execute(
        _DROP_TASK, {"p_task_id": claim.worker_task_id, "p_attempt": claim.attempt}, execution_options=_NO_SYNC
    )
    return bool(cast(CursorResult[Any], closed).rowcount)


# --- advancing --------------------------------------------------------------------------------


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
    return _finish_execution(session, execution, guard, status, error=outcome.error, now=now) or Effects()


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
        execution.id, step_index, tuple(StepDispatch(execution.id, i, a, specs[n]) for i, a, n in tasks)
    )


def _finish_execution(
    session: Session,
    execution: ScheduleExecution,
    guard: Any,
    status: ExecutionStatus,
    *,
    error: str | None,
    now: datetime,
) -> Effects | None:
    """End the execution if ``guard`` still holds; ``None`` if someone else changed it first."""
    if execution.schedule_id is not None:
        lock_schedule(session, execution.schedule_id)
    done = affected(
        session,
        update(ScheduleExecution)
        .where(*guard)
        .values(status=status, error=error, completed_at=now, exclusive_key=None),
    )
    if not done:
        return None
    session.execute(delete(WorkerTask).where(WorkerTask.execution_id == execution.id))
    if status is ExecutionStatus.FAILED:
        logger.warning("execution %s of %r failed: %s", execution.id, execution.schedule_name, error)
    else:
        logger.info("execution %s of %r %s", execution.id, execution.schedule_name, status.value)
    effects = _after_execution(session, execution, status, error=error, now=now)
    effects.ended.append(execution.id)
    return effects


def _after_execution(
    session: Session, execution: ScheduleExecution, status: ExecutionStatus, *, error: str | None, now: datetime
) -> Effects:
    """Schedule bookkeeping once an execution ends: counters, repeats, retries, a run that waited.

    The schedule's row lock is held (taken by :func:`_finish_execution`), so what is read here is
    current; the changes are still made as compare-and-set updates.
    """
    if execution.schedule_id is None:
        return Effects()
    schedule = session.get(Schedule, execution.schedule_id)
    if schedule is None:
        return Effects()
    by_id = Schedule.id == schedule.id
    read = (Schedule.status, Schedule.current_retry, Schedule.retry_at, Schedule.run_count, Schedule.buffered)
    counters: dict[str, Any] = {}
    if status is ExecutionStatus.COMPLETED:
        counters = {"run_count": Schedule.run_count + 1}
    elif status is ExecutionStatus.FAILED:
        counters = {"error_count": Schedule.error_count + 1, "last_error": error}
    # Counters change with atomic increments whose new values come back (RETURNING).
    if counters:
        row = session.execute(
            update(Schedule).where(by_id).values(**counters).returning(*read), execution_options=_NO_SYNC
        ).one()
    else:
        row = session.execute(select(*read).where(by_id)).one()
    state = ScheduleState(row.status, row.current_retry, row.retry_at)
    pending_key = run_key(schedule.name, Trigger.RETRY, state.retry_at, state.current_retry) if state.retry_at else None
    is_pending_retry = execution.run_key == pending_key
    definition = definition_of(schedule)
    after = decide_after_execution(
        state,
        RetryPolicy(definition.max_retries, definition.total_repeats, definition.retry_base_s),
        ended=status,
        is_pending_retry=is_pending_retry,
        pending_retry_started=is_pending_retry or _pending_retry_started(session, state, pending_key, now),
        run_count=row.run_count,
        buffered=row.buffered,
        now=now,
    )
    # Retry time, done or dead: the beat entry follows. A run that changed none of them (most runs)
    # leaves the entry alone: no read of it per run. A lost race is synced anyway.
    changed = (after.status, after.current_retry, after.retry_at) != (state.status, state.current_retry, state.retry_at)
    effects = Effects(resync=[schedule.name] if changed else [])
    if not _apply_after(session, schedule, state, after, now=now):
        logger.warning("schedule %r changed while execution %s ended; left as it is", schedule.name, execution.id)
        return Effects(resync=[schedule.name])
    _log_after(schedule.name, state, after, run_count=row.run_count, is_pending_retry=is_pending_retry, ended=status)
    if after.start is NextRun.RETRY and state.retry_at is not None and pending_key is not None:
        started = start_execution(
            session, schedule, trigger=Trigger.RETRY, now=now, nominal_at=state.retry_at, run_key=pending_key
        )
        effects.merge(started.effects)
    elif after.start is NextRun.BUFFERED and affected(
        session,
        update(Schedule)
        .where(by_id, Schedule.buffered.is_(True), Schedule.status == ScheduleStatus.ACTIVE)
        .values(buffered=False)
        .execution_options(synchronize_session=False),
    ):
        started = start_execution(
            session, schedule, trigger=execution.trigger, now=now, run_key=f"{schedule.name}:after:{execution.id}"
        )
        effects.merge(started.effects)
    return effects


def _pending_retry_started(session: Session, state: ScheduleState, key: str | None, now: datetime) -> bool:
    """Whether the pending retry's run exists; only asked once the retry is due."""
    if state.retry_at is None or key is None or state.retry_at > now:
        return False
    return session.scalar(select(ScheduleExecution.id).where(ScheduleExecution.run_key == key)) is not None


def _apply_after(
    session: Session, schedule: Schedule, state: ScheduleState, after: AfterExecution, *, now: datetime
) -> bool:
    """Write the decided retry state and status, guarded on what the decision read."""
    changes: dict[str, Any] = {}
    if (after.current_retry, after.retry_at) != (state.current_retry, state.retry_at):
        changes.update(current_retry=after.current_retry, retry_at=after.retry_at)
    if after.status is not state.status:
        changes.update(status=after.status, retry_at=None, next_run_at=None, buffered=False)
    if not changes:
        return True
    changes["changed_at"] = now  # the beat entry follows: the incremental reconcile must see it
    return bool(
        affected(
            session,
            update(Schedule)
            .where(
                Schedule.id == schedule.id,
                Schedule.status == state.status,
                Schedule.current_retry == state.current_retry,
                Schedule.retry_at.is_not_distinct_from(state.retry_at),
            )
            .values(**changes)
            .execution_options(synchronize_session=False),
        )
    )


def _log_after(
    name: str,
    state: ScheduleState,
    after: AfterExecution,
    *,
    run_count: int,
    is_pending_retry: bool,
    ended: ExecutionStatus,
) -> None:
    if after.status is ScheduleStatus.DONE:
        logger.info("schedule %r is done after %s runs", name, run_count)
    elif after.status is ScheduleStatus.DEAD:
        logger.error("schedule %r is dead: %s consecutive failures", name, state.current_retry + 1)
    elif after.counted and after.retry_at is not None:
        logger.info("schedule %r: retry %s at %s", name, after.current_retry, iso(after.retry_at))
    elif ended is ExecutionStatus.FAILED and state.retry_at is not None and not is_pending_retry:
        logger.info("schedule %r: retry %s is already pending; no retry added", name, state.current_retry)


# --- cancelling -------------------------------------------------------------------------------


def cancel_execution(
    session: Session,
    execution_id: int,
    *,
    now: datetime,
    reason: str = "cancelled",
    status: ExecutionStatus = ExecutionStatus.CANCELLED,
) -> Effects:
    """Stop an in-progress execution; a finished one is left as it is.

    ``status`` is ``failed`` when the cancel is a timeout, so the run counts as a failure.
    """
    execution = session.get(ScheduleExecution, execution_id)
    if execution is None:
        raise NotFound(f"execution {execution_id} does not exist")
    if execution.status is not ExecutionStatus.IN_PROGRESS:
        return Effects()
    guard = (ScheduleExecution.id == execution_id, ScheduleExecution.status == ExecutionStatus.IN_PROGRESS)
    running = session.execute(
        select(WorkerTask.id, WorkerTask.attempt).where(
            WorkerTask.execution_id == execution_id, WorkerTask.status != WorkerTaskStatus.WAITING
        )
    ).all()
    effects = _finish_execution(session, execution, guard, status, error=reason, now=now)
    if effects is None:
        return Effects()  # it ended meanwhile: nothing to cancel
    session.execute(
        update(Activity)
        .where(Activity.execution_id == execution_id, Activity.status == ActivityStatus.IN_PROGRESS)
        .values(status=ActivityStatus.CANCELLED, completed_at=now, error=reason)
    )
    effects.cancelled.append(execution_id)
    effects.revoke += [keys.runner_task_id(execution_id, i, a) for i, a in running]
    return effects


# --- recovery ---------------------------------------------------------------------------------


def requeue_attempt(session: Session, worker_task_id: int, attempt: int, *, reason: str, now: datetime) -> Effects:
    """An attempt's worker is gone: fail its activity, then run it again or, out of attempts (or past
    its timeout: a crash then is the timeout's hard kill, not bad luck), fail the step.

    Fenced by the attempt number, so a late message of the interrupted attempt finds nothing to
    claim, and two recoveries racing each other requeue once. The attempt is also fenced in Redis,
    so that if it is in fact still running (a frozen worker), it stops.
    """
    task = session.get(WorkerTask, worker_task_id)
    if task is None or task.attempt != attempt or task.status is not WorkerTaskStatus.PROCESSING:
        return Effects()
    execution = session.get_one(ScheduleExecution, task.execution_id)
    spec = _spec_of(execution, task)
    verdict = decide_lost_attempt(
        attempt, spec.max_attempts, started_at=task.started_at, timeout_s=spec.timeout_s, now=now, reason=reason
    )
    session.execute(
        update(Activity)
        .where(
            Activity.execution_id == execution.id,
            Activity.step_name == task.step_name,
            Activity.attempt == attempt,
            Activity.status == ActivityStatus.IN_PROGRESS,
        )
        .values(status=ActivityStatus.FAILED_WITH_ERROR, completed_at=now, error=verdict.error)
    )
    fenced = (
        WorkerTask.id == worker_task_id,
        WorkerTask.attempt == attempt,
        WorkerTask.status == WorkerTaskStatus.PROCESSING,
    )
    if verdict.requeue:
        moved = affected(
            session,
            update(WorkerTask)
            .where(*fenced)
            .values(status=WorkerTaskStatus.QUEUED, attempt=attempt + 1, node=None, started_at=None, queued_at=now),
        )
        if not moved:
            return Effects()
        logger.warning(
            "step %r of execution %s: %s; re-queued as attempt %s", task.step_name, execution.id, reason, attempt + 1
        )
        step = StepDispatch(execution.id, worker_task_id, attempt + 1, spec)
        return Effects(
            dispatch=[GroupDispatch(execution.id, task.step_index, (step,), requeue=True)],
            fenced=[(worker_task_id, attempt)],
        )
    if not affected(session, delete(WorkerTask).where(*fenced)):
        return Effects()
    logger.error("step %r of execution %s: %s; not run again", task.step_name, execution.id, verdict.error)
    effects = advance_execution(session, execution.id, task.step_index, now=now)
    effects.fenced.append((worker_task_id, attempt))
    return effects


def resend_queued(session: Session, worker_task_id: int, *, now: datetime) -> Effects:
    """Send again a queued attempt whose message is gone (Redis lost data, or a crash before publish).

    A second message for the same attempt is harmless: only one runner can claim it.
    """
    task = session.get(WorkerTask, worker_task_id)
    if task is None or task.status is not WorkerTaskStatus.QUEUED:
        return Effects()
    execution = session.get_one(ScheduleExecution, task.execution_id)
    if execution.status is not ExecutionStatus.IN_PROGRESS:
        return Effects()
    spec = _spec_of(execution, task)
    session.execute(
        update(WorkerTask)
        .where(WorkerTask.id == worker_task_id, WorkerTask.status == WorkerTaskStatus.QUEUED)
        .values(queued_at=now)
    )
    step = StepDispatch(execution.id, worker_task_id, task.attempt, spec)
    return Effects(dispatch=[GroupDispatch(execution.id, task.step_index, (step,), requeue=True)])
