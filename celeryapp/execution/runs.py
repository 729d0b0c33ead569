"""A run's life in the database: its start (the overlap policy applied, alone or several
schedules' runs together), its end, cancelling, and what its schedule keeps of it (counters,
repeats, retries, a run that waited).

Start and end share this module because each leads to the other: ``cancel_previous`` ends the
active runs as a new one starts, and an ending run starts the retry or the buffered run that
waited for it. The rows a run is made of are built in run_rows.py.

Every change is a compare-and-set; its effects are sent after commit (docs/architecture.md "Compare-and-set").
"""

from __future__ import annotations

import logging
from datetime import datetime
from functools import partial
from typing import Any, NamedTuple

from sqlalchemy import delete, exists, select, update
from sqlalchemy.orm import Session

from celeryapp.domain.decisions import (
    AfterExecution,
    NextRun,
    OverlapAction,
    OverlapDecision,
    RetryPolicy,
    ScheduleState,
    decide_after_execution,
    decide_overlap,
)
from celeryapp.domain.definition import retry_base_s
from celeryapp.domain.effects import Effects
from celeryapp.domain.names import run_key
from celeryapp.domain.times import iso
from celeryapp.errors import NotFound
from celeryapp.execution.backfill_driver import drive, has_running_backfill, regular_trigger
from celeryapp.execution.limit_steps import release_attempts, run_attempts
from celeryapp.execution.run_rows import (
    Rerun,
    StartResult,
    execution_row,
    execution_with_key,
    first_group,
    insert_ignoring_conflicts,
    insert_worker_tasks,
)
from celeryapp.execution.slots import BUFFERED_SLOT, SlotRow, record_slot, record_slots
from celeryapp.monitoring import metric_counts
from celeryapp.monitoring.alert_outbox import alert_run_ended, raise_alert
from celeryapp.states import AuditAction
from models import (
    Activity,
    ActivityStatus,
    AlertKind,
    ExecutionStatus,
    Overlap,
    Schedule,
    ScheduleExecution,
    ScheduleStatus,
    SlotOutcome,
    Trigger,
    WorkerTask,
)
from models.audit import BEAT, Note
from models.definitions import definition_of
from models.session import NO_SYNC, affected
from models.tables import EXECUTIONS
from models.versions import PinnedVersion

logger = logging.getLogger(__name__)

#: The audit row of a run the overlap policy ``cancel_previous`` stopped.
_BY_OVERLAP = Note(BEAT, AuditAction.CANCELLED_BY_OVERLAP, "a new run started (overlap: cancel_previous)")


def lock_schedule(session: Session, schedule_id: int) -> None:
    """Take the schedule's row lock until commit (PostgreSQL; SQLite's writers exclude each other).

    Whatever starts or ends a run of the schedule takes it first. A fire therefore reads the
    schedule's runs only after an ending run committed (it cannot see that run as active and
    buffer a run nobody will start), and locks are always taken schedule first, then execution,
    so starts and ends cannot deadlock each other.
    """
    session.execute(select(Schedule.id).where(Schedule.id == schedule_id).with_for_update())


def _active_executions(session: Session, schedule_id: int) -> list[tuple[int, int | None]]:
    """The schedule's runs in progress, oldest first, each with its backfill (None: not a backfill's)."""
    return [
        (execution_id, backfill_id)
        for execution_id, backfill_id in session.execute(
            select(ScheduleExecution.id, ScheduleExecution.backfill_id)
            .where(
                ScheduleExecution.schedule_id == schedule_id,
                ScheduleExecution.status == ExecutionStatus.IN_PROGRESS,
            )
            .order_by(ScheduleExecution.id)
        )
    ]


def _apply_overlap(
    session: Session,
    schedule: Schedule,
    overlap: OverlapDecision,
    *,
    trigger: Trigger,
    nominal_at: datetime | None,
    now: datetime,
) -> StartResult | None:
    """Apply a run's overlap decision: record why it does not start; ``None`` if it was to be
    buffered but the active run ended meanwhile: start it."""
    if overlap.action is OverlapAction.BUFFER:
        still_running = exists().where(
            ScheduleExecution.schedule_id == schedule.id, ScheduleExecution.status == ExecutionStatus.IN_PROGRESS
        )
        if not affected(
            session, update(Schedule).where(Schedule.id == schedule.id, still_running).values(buffered=True)
        ):
            return None
    if overlap.outcome is not None:
        record_slot(
            session, schedule, overlap.outcome, trigger=trigger, nominal_at=nominal_at, now=now, detail=overlap.detail
        )
    # Skips are counted for the deployment's overload warning (one a minute), not logged one by one.
    logger.info("schedule %r: %s", schedule.name, overlap.detail)
    skipped = 1 if overlap.action is OverlapAction.SKIP else 0
    return StartResult(None, skipped=overlap.skipped, effects=Effects(skipped_overlap=skipped))


def start_execution(
    session: Session,
    schedule: Schedule,
    *,
    trigger: Trigger,
    run_key: str,
    now: datetime,
    payload: dict[str, Any] | None = None,
    nominal_at: datetime | None = None,
    locked: bool = False,
    no_active: bool = False,
    rerun: Rerun | None = None,
    backfill_id: int | None = None,
    detail: str | None = None,
    pinned: PinnedVersion | None = None,
) -> StartResult:
    """Create an execution with all its worker tasks, honouring the schedule's overlap policy.

    ``locked``: the caller holds the schedule's row lock; ``no_active``: and found no active run.
    ``rerun``: the run is that of an ended execution's plan, not of the current definition.
    ``nominal_at`` is stored as the run's slot; ``backfill_id``: the backfill starting it (whose
    driver checked the overlap first); ``detail``: its slot record's; ``pinned``: the definition
    version it runs instead of the current one (a backfill's named version).
    """
    if not locked:
        lock_schedule(session, schedule.id)
    effects = Effects()
    # Whatever the active runs are, ``allow`` starts: no need to read them.
    active = [] if no_active or schedule.overlap is Overlap.ALLOW else _active_executions(session, schedule.id)
    if active:
        # Before cancelling or buffering anything for it: a redelivered start is a duplicate.
        existing = execution_with_key(session, run_key)
        if existing is not None:
            return StartResult(existing, skipped="duplicate")
        backfill_run = next((execution_id for execution_id, of in active if of is not None), None)
        overlap = decide_overlap(
            schedule.overlap,
            trigger,
            active_id=active[0][0],
            current_retry=schedule.current_retry,
            backfill_run=backfill_run,
        )
        if overlap.action is OverlapAction.CANCEL_AND_START:
            for execution_id, _ in active:
                # The room it leaves is the new run's, which starts next: no waiting backfill takes it.
                why, note = "cancelled: a new run started", _BY_OVERLAP
                effects.merge(cancel_execution(session, execution_id, now=now, reason=why, note=note, backfills=False))
        elif overlap.action is not OverlapAction.START:
            overlapped = _apply_overlap(session, schedule, overlap, trigger=trigger, nominal_at=nominal_at, now=now)
            if overlapped is not None:
                return overlapped

    definition = definition_of(schedule) if pinned is None else pinned.definition
    # One statement: a unique conflict (the same run key, or another active run of an exclusive
    # schedule) inserts nothing instead of failing, and is sorted out below.
    row = execution_row(
        schedule,
        definition,
        trigger=trigger,
        run_key=run_key,
        now=now,
        payload=payload,
        rerun=rerun,
        slot=nominal_at,
        backfill_id=backfill_id,
        version=None if pinned is None else pinned.version,
    )
    execution_id = session.scalar(insert_ignoring_conflicts(session).values(row).returning(EXECUTIONS.c.id))
    if execution_id is None:
        winner = execution_with_key(session, run_key)
        if winner is not None:
            return StartResult(winner, skipped="duplicate")
        # Lost the race for the schedule's one active run to a run that just started.
        overlap = decide_overlap(
            schedule.overlap, trigger, active_id=None, current_retry=schedule.current_retry, lost_race=True
        )
        overlapped = _apply_overlap(session, schedule, overlap, trigger=trigger, nominal_at=nominal_at, now=now)
        return overlapped or StartResult(None, skipped="overlap: another execution is in progress")

    groups, start = (definition.run_groups, 0) if rerun is None else (rerun.groups, rerun.from_group)
    task_ids = insert_worker_tasks(session, {execution_id: groups}, now=now, start_group=start)[execution_id]
    session.execute(update(Schedule).where(Schedule.id == schedule.id).values(last_run_at=now))
    record_slot(
        session,
        schedule,
        SlotOutcome.FIRED,
        trigger=trigger,
        nominal_at=nominal_at,
        now=now,
        execution_id=execution_id,
        detail=detail,
    )
    effects.merge(first_group(session, schedule, groups, execution_id, row, task_ids, trigger, start))
    return StartResult(execution_id, effects=effects)


class Start(NamedTuple):
    """A run to start by :func:`start_executions`."""

    schedule: Schedule
    trigger: Trigger
    run_key: str
    nominal_at: datetime


def start_executions(session: Session, starts: list[Start], *, now: datetime) -> list[StartResult]:
    """Start runs of several schedules in a few statements, whatever their number (a beat tick's fires).

    The caller holds every schedule's row lock and found no active run of any that is not
    ``overlap: allow`` (what :func:`start_execution` checks first), and no schedule appears twice.
    A run key already used makes no run ("duplicate"), as in :func:`start_execution`.
    """
    definitions = [definition_of(start.schedule) for start in starts]
    rows = [
        execution_row(
            start.schedule, definition, trigger=start.trigger, run_key=start.run_key, now=now, slot=start.nominal_at
        )
        for start, definition in zip(starts, definitions, strict=True)
    ]
    inserted = session.connection().execute(
        insert_ignoring_conflicts(session).returning(EXECUTIONS.c.run_key, EXECUTIONS.c.id), rows
    )
    ids: dict[str, int] = {key: execution_id for key, execution_id in inserted}
    made = {ids[s.run_key]: d.groups for s, d in zip(starts, definitions, strict=True) if s.run_key in ids}
    task_ids = insert_worker_tasks(session, made, now=now) if made else {}
    results: list[StartResult] = []
    slots: list[SlotRow] = []
    for start, definition, row in zip(starts, definitions, rows, strict=True):
        execution_id = ids.get(start.run_key)
        if execution_id is None:
            # The row lock and the caller's check leave only one conflict: the run key's.
            results.append(StartResult(execution_with_key(session, start.run_key), skipped="duplicate"))
            continue
        first = first_group(
            session, start.schedule, definition.run_groups, execution_id, row, task_ids[execution_id], start.trigger
        )
        results.append(StartResult(execution_id, effects=first))
        slots.append(SlotRow(start.schedule, SlotOutcome.FIRED, start.trigger, start.nominal_at, execution_id))
    if slots:
        started_ids = [row.owner.id for row in slots]
        session.execute(update(Schedule).where(Schedule.id.in_(started_ids)).values(last_run_at=now))
        record_slots(session, slots, now=now)
    return results


def finish_execution(
    session: Session,
    execution: ScheduleExecution,
    guard: Any,
    status: ExecutionStatus,
    *,
    error: str | None,
    now: datetime,
    cancel: bool = False,
    backfills: bool = True,
) -> Effects | None:
    """End the execution if ``guard`` still holds; ``None`` if someone else changed it first.

    ``cancel``: its attempts still running end with it (their activities closed as cancelled)
    and stop (the cancel flag). ``backfills``: the schedule's backfills may start in the room it leaves. Locks
    are taken in the documented order (docs/architecture.md, "Locks"): schedule, execution, worker
    tasks, activities, then the metric counts.
    """
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
    # Under the execution's lock: a queued step's claim then finds neither its task nor the run.
    attempts = run_attempts(session, execution.id, execution.plan)
    session.execute(
        delete(WorkerTask).where(WorkerTask.execution_id == execution.id),
        execution_options=NO_SYNC,
    )
    if cancel:
        session.execute(
            update(Activity)
            .where(Activity.execution_id == execution.id, Activity.status == ActivityStatus.IN_PROGRESS)
            .values(status=ActivityStatus.CANCELLED, completed_at=now, error=error)
        )
    # Its slots given back and its waits dropped with it: a running step's goes with its run.
    admitted = release_attempts(session, attempts, now=now)
    metric_counts.observe_execution(session, execution, status, now)
    if status is ExecutionStatus.FAILED:
        logger.warning("execution %s of %r failed: %s", execution.id, execution.schedule_name, error)
    else:
        logger.info("execution %s of %r %s", execution.id, execution.schedule_name, status.value)
    effects = _after_execution(session, execution, status, error=error, now=now, backfills=backfills)
    effects.ended.append(execution.id)
    effects.merge(admitted)
    if cancel:
        # Running steps stop through the cancel flag (not a revoke: chordbeat sends no remote
        # control command); queued ones run, and their claim finds the run over.
        effects.cancelled.append((execution.id, execution.token))
    return effects


def _after_execution(
    session: Session,
    execution: ScheduleExecution,
    status: ExecutionStatus,
    *,
    error: str | None,
    now: datetime,
    backfills: bool,
) -> Effects:
    """Schedule bookkeeping once an execution ends: counters, repeats, retries, a run that waited.

    The schedule's row lock is held (taken by :func:`finish_execution`), so what is read here is
    current; the changes are still made as compare-and-set updates.
    """
    if execution.schedule_id is None:
        return Effects()
    by_id = Schedule.id == execution.schedule_id
    # Columns, not the schedule with its steps: only a run started from here needs those.
    read = (
        Schedule.name,
        Schedule.status,
        Schedule.current_retry,
        Schedule.retry_at,
        Schedule.run_count,
        Schedule.buffered,
        Schedule.max_retries,
        Schedule.total_repeats,
        Schedule.every_s,
        Schedule.retry_delay_s,
        Schedule.alerts,
        # In the same statement: a schedule without backfills pays nothing more per run.
        has_running_backfill(Schedule.id).label("backfilling"),
    )
    counters: dict[str, Any] = {}
    # A backfill's (or catch-up's) run is no regular run: it counts toward no run or error count,
    # repeat limit, retry or death. A failed slot is run again by a backfill of mode ``failed``.
    backfill_run = execution.backfill_id is not None
    if status is ExecutionStatus.COMPLETED and not backfill_run:
        counters = {"run_count": Schedule.run_count + 1}
    elif status is ExecutionStatus.FAILED and not backfill_run:
        counters = {"error_count": Schedule.error_count + 1, "last_error": error}
    # Counters change with atomic increments whose new values come back (RETURNING).
    if counters:
        row = session.execute(
            update(Schedule).where(by_id).values(**counters).returning(*read), execution_options=NO_SYNC
        ).first()
    else:
        row = session.execute(select(*read).where(by_id)).first()
    if row is None:
        return Effects()  # the schedule was deleted meanwhile
    alert_run_ended(session, execution, status, error=error, now=now, config=row.alerts)
    name, schedule_id = row.name, execution.schedule_id
    state = ScheduleState(row.status, row.current_retry, row.retry_at)
    pending_key = run_key(name, Trigger.RETRY, state.retry_at, state.current_retry) if state.retry_at else None
    is_pending_retry = execution.run_key == pending_key
    after = decide_after_execution(
        state,
        RetryPolicy(row.max_retries, row.total_repeats, retry_base_s(row.every_s, row.retry_delay_s)),
        # As a cancelled run of no retry, a backfill's run leaves the retry state and status as
        # they are, and still starts what waited for it.
        ended=ExecutionStatus.CANCELLED if backfill_run else status,
        is_pending_retry=is_pending_retry,
        pending_retry_started=is_pending_retry or _pending_retry_started(session, state, pending_key, now),
        run_count=row.run_count,
        buffered=row.buffered,
        now=now,
    )
    # Retry time, done or dead: the beat entry follows. A run that changed none of them (most runs)
    # leaves the entry alone: no read of it per run. A lost race is synced anyway.
    changed = (after.status, after.current_retry, after.retry_at) != (state.status, state.current_retry, state.retry_at)
    effects = Effects(resync=[name] if changed else [])
    if not _write_after_run(session, schedule_id, state, after, now=now):
        logger.warning("schedule %r changed while execution %s ended; left as it is", name, execution.id)
        return Effects(resync=[name])
    _log_after_run(
        session,
        name,
        execution.id,
        state,
        after,
        run_count=row.run_count,
        is_pending_retry=is_pending_retry,
        ended=status,
        now=now,
    )
    if after.start is NextRun.RETRY and state.retry_at is not None and pending_key is not None:
        started = start_execution(
            session,
            session.get_one(Schedule, schedule_id),
            trigger=Trigger.RETRY,
            now=now,
            nominal_at=state.retry_at,
            run_key=pending_key,
            locked=True,
        )
        effects.merge(started.effects)
    elif after.start is NextRun.BUFFERED and affected(
        session,
        update(Schedule)
        .where(by_id, Schedule.buffered.is_(True), Schedule.status == ScheduleStatus.ACTIVE)
        .values(buffered=False)
        .execution_options(synchronize_session=False),
    ):
        # A regular slot buffered behind a backfill's run is a regular run.
        trigger = execution.trigger if execution.trigger is not Trigger.BACKFILL else regular_trigger(row.every_s)
        slot, slot_trigger = session.execute(BUFFERED_SLOT, {"p_name": name}).first() or (None, None)
        key = f"{name}:after:{execution.id}"
        if slot is not None and slot_trigger in (Trigger.CRON, Trigger.INTERVAL):
            # The slot's own key: a backfill (mode missing) or a catch-up of the slot is one run with it.
            key = run_key(name, regular_trigger(row.every_s), slot)
        started = start_execution(
            session,
            session.get_one(Schedule, schedule_id),
            trigger=trigger,
            now=now,
            run_key=key,
            nominal_at=slot,
            locked=True,
        )
        effects.merge(started.effects)
    if row.backfilling and backfills:
        effects.merge(drive(session, schedule_id, now=now, start=start_execution))
    return effects


def _pending_retry_started(session: Session, state: ScheduleState, key: str | None, now: datetime) -> bool:
    """Whether the pending retry's run exists; only asked once the retry is due."""
    if state.retry_at is None or key is None or state.retry_at > now:
        return False
    return execution_with_key(session, key) is not None


def _write_after_run(
    session: Session, schedule_id: int, state: ScheduleState, after: AfterExecution, *, now: datetime
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
                Schedule.id == schedule_id,
                Schedule.status == state.status,
                Schedule.current_retry == state.current_retry,
                Schedule.retry_at.is_not_distinct_from(state.retry_at),
            )
            .values(**changes)
            .execution_options(synchronize_session=False),
        )
    )


def _log_after_run(
    session: Session,
    name: str,
    execution_id: int,
    state: ScheduleState,
    after: AfterExecution,
    *,
    run_count: int,
    is_pending_retry: bool,
    ended: ExecutionStatus,
    now: datetime,
) -> None:
    """Log what the end of a run did to its schedule; beat's decisions (done, dead, a retry) also
    get their audit row, in the transaction that writes them."""
    audit = partial(BEAT.record, session, schedule_name=name, execution_id=execution_id, at=now)
    if after.status is ScheduleStatus.DONE:
        logger.info("schedule %r is done after %s runs", name, run_count)
        audit(AuditAction.DONE, reason=f"repeat limit reached after {run_count} runs")
    elif after.status is ScheduleStatus.DEAD:
        failures = state.current_retry + 1
        logger.error("schedule %r is dead: %s consecutive failures", name, failures)
        audit(AuditAction.DEAD, reason=f"{failures} consecutive failures", detail={"failures": failures})
        message = f"{name} is dead after {failures} consecutive failures; nothing runs until it is resumed"
        raise_alert(
            session, schedule_name=name, kind=AlertKind.DEAD, message=message, now=now, execution_id=execution_id
        )
    elif after.counted and after.retry_at is not None:
        logger.info("schedule %r: retry %s at %s", name, after.current_retry, iso(after.retry_at))
        detail = {"retry": after.current_retry, "at": iso(after.retry_at)}
        audit(
            AuditAction.RETRY_SCHEDULED, reason=f"retry {after.current_retry} at {iso(after.retry_at)}", detail=detail
        )
    elif ended is ExecutionStatus.FAILED and state.retry_at is not None and not is_pending_retry:
        logger.info("schedule %r: retry %s is already pending; no retry added", name, state.current_retry)


def cancel_execution(
    session: Session,
    execution_id: int,
    *,
    now: datetime,
    reason: str = "cancelled",
    status: ExecutionStatus = ExecutionStatus.CANCELLED,
    note: Note | None = None,
    backfills: bool = True,
) -> Effects:
    """Stop an in-progress execution; a finished one is left as it is. ``reason``: its error;
    ``note``: the audit row written when it was stopped (not when it had ended already).

    ``status`` is ``failed`` when the cancel is a timeout, so the run counts as a failure.
    """
    execution = session.get(ScheduleExecution, execution_id)
    if execution is None:
        raise NotFound(f"execution {execution_id} does not exist")
    if execution.status is not ExecutionStatus.IN_PROGRESS:
        return Effects()
    guard = (ScheduleExecution.id == execution_id, ScheduleExecution.status == ExecutionStatus.IN_PROGRESS)
    effects = finish_execution(
        session, execution, guard, status, error=reason, now=now, cancel=True, backfills=backfills
    )
    if effects is None:
        return Effects()  # it ended meanwhile, nothing to cancel
    if note is not None:
        note.actor.record(session, note.action, execution.schedule_name, execution_id=execution_id, reason=note.reason)
    return effects
