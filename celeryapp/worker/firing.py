"""What beat's fire messages do: start the run of a nominal slot, or record why not.

A tick sends the slots due together in one message (:func:`fire_batch`): the ones that simply
start a run share one transaction and a few statements, whatever their number; any other (a
retry, an overlap, missed slots to record, a paused schedule...) goes through :func:`fire` alone.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from sqlalchemy import bindparam, func, select
from sqlalchemy.orm import Session, joinedload

from celeryapp.domain.batching import BatchSchedule, Fire, decide_batchable
from celeryapp.domain.cadence import cadence_of
from celeryapp.domain.catchup import CatchupPolicy, CatchupRules, policy_of, too_late
from celeryapp.domain.decisions import ScheduleState, decide_calendar, decide_fire, decide_late, decide_overlap
from celeryapp.domain.effects import Effects
from celeryapp.domain.limits import MAX_FIRE_BATCH, MAX_NAME_CHARS, short_repr, type_name
from celeryapp.domain.names import run_key
from celeryapp.errors import ChordbeatError, InvalidArgument
from celeryapp.execution.backfill_driver import regular_trigger
from celeryapp.execution.runs import Start, start_execution, start_executions
from celeryapp.execution.slots import SlotOwner, claim_slot, claimed_slots, record_missed, record_slot, recorded
from celeryapp.runtime import Runtime
from celeryapp.scheduling.beat_entries import ENTRY_COLUMNS, EntryFields
from celeryapp.scheduling.calendar_files import slot_calendar_reason
from celeryapp.worker.catchup_fires import record_unfired, start_catchup
from celeryapp.worker.dispatch import apply_effects
from celeryapp.worker.moved_fires import mover, start_moved
from models import (
    ExecutionStatus,
    Overlap,
    Schedule,
    ScheduleExecution,
    ScheduleStatus,
    SlotOutcome,
    Trigger,
    transaction,
    utcnow,
)
from models.session import retried_transaction, retrying

logger = logging.getLogger(__name__)


#: A fire message's slot may lie this far in the future of the reference clock. Beat reckons slots
#: by that clock too, so only a message sent by hand gets near it: further, it is forged, and
#: claiming it would make every real slot before it look superseded.
MAX_SLOT_AHEAD = timedelta(seconds=60)
#: What beat (and the lost-fire re-fire) send; manual runs go through ``trigger_schedule``.
FIRE_TRIGGERS = (Trigger.CRON, Trigger.INTERVAL, Trigger.RETRY)


def fire_arguments(name: Any, nominal_at: Any, trigger: Any, *, now: datetime) -> tuple[str, datetime, Trigger]:
    """Check a fire message's arguments: anyone who can publish can send one."""
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME_CHARS:
        raise InvalidArgument("name", f"must be a schedule name (a string of 1 to {MAX_NAME_CHARS} characters)")
    if trigger is None:
        kind = Trigger.CRON
    else:
        choices = ", ".join(t.value for t in FIRE_TRIGGERS)
        if not isinstance(trigger, str) or trigger not in {t.value for t in FIRE_TRIGGERS}:
            raise InvalidArgument("trigger", f"must be one of {choices}, got {short_repr(trigger)}")
        kind = Trigger(trigger)
    if nominal_at is None:
        return name, now, kind
    try:
        when = datetime.fromisoformat(nominal_at) if isinstance(nominal_at, str) and len(nominal_at) <= 40 else None
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise InvalidArgument(
            "nominal_at", f"must be an ISO 8601 time with its UTC offset, got {short_repr(nominal_at)}"
        )
    if when > now + MAX_SLOT_AHEAD:
        raise InvalidArgument(
            "nominal_at", f"{when.isoformat()} is in the future; a fire stands for a slot that is due"
        )
    return name, when, kind


def fire(app: Runtime, name: str, *, nominal_at: datetime, trigger: Trigger) -> dict[str, Any]:
    def attempt() -> tuple[dict[str, Any], Effects]:
        effects = Effects()  # a fresh one each time: an aborted try's decisions were rolled back
        return _fire(app, name, nominal_at=nominal_at, trigger=trigger, effects=effects), effects

    answer, effects = retrying(f"fire of {name!r} for {nominal_at.isoformat()}", attempt)
    apply_effects(app, effects)
    return answer


_FIRE_FIELDS = frozenset(Fire._fields)


def batch_arguments(fires: Any, *, now: datetime) -> list[Fire]:
    """Check a batch fire message's argument; one bad slot refuses the whole message."""
    if not isinstance(fires, list) or not 1 <= len(fires) <= MAX_FIRE_BATCH:
        got = f"{len(fires)} slots" if isinstance(fires, list) else type_name(fires)
        raise InvalidArgument("fires", f"must be a list of 1 to {MAX_FIRE_BATCH} slots, got {got}")
    checked: list[Fire] = []
    for index, item in enumerate(fires):
        if not isinstance(item, dict) or set(item) != _FIRE_FIELDS:
            got = f"keys {short_repr(sorted(map(str, item)))}" if isinstance(item, dict) else type_name(item)
            raise InvalidArgument(f"fires[{index}]", f"must be an object with name, nominal_at and trigger, got {got}")
        if item["nominal_at"] is None:
            raise InvalidArgument(
                f"fires[{index}].nominal_at", "must be an ISO 8601 time with its UTC offset, got null"
            )
        try:
            checked.append(Fire(*fire_arguments(item["name"], item["nominal_at"], item["trigger"], now=now)))
        except InvalidArgument as exc:
            raise InvalidArgument(f"fires[{index}].{exc.field}", exc.reason) from None
    return checked


def fire_batch(app: Runtime, fires: list[Fire]) -> list[dict[str, Any]]:
    """Fire several slots: what simply starts a run in one transaction, the rest one by one.

    Each slot's outcome is what :func:`fire` would have made of it alone. A failure of one slot
    fired alone does not stop the others; the first is raised once all were tried.
    """
    together = partial(_fire_together, fires=fires, grace_s=app.settings.alert_missed_grace_s)
    try:
        answers, alone, effects = retried_transaction(app.settings.database_url, "fires together", together)
    except Exception:
        # Nothing was committed: every slot gets its own transaction, and its own error.
        logger.exception("fires of %s schedules together failed; firing each alone", len(fires))
        answers, alone, effects = {}, list(range(len(fires))), Effects()
    apply_effects(app, effects)
    failures: list[Exception] = []
    for index in sorted(alone):
        slot = fires[index]
        try:
            answers[index] = fire(app, slot.name, nominal_at=slot.nominal_at, trigger=slot.trigger)
        except Exception as exc:
            # The first with its traceback; when the database is away, the rest say the same.
            if not failures:
                logger.exception("fire of %r for %s failed", slot.name, slot.nominal_at.isoformat())
            failures.append(exc)
            answers[index] = {"execution_id": None, "skipped": f"failed: {type(exc).__name__}"}
    if failures:
        logger.error("%s of %s fires failed; the lost-slot re-fire retries them", len(failures), len(fires))
        raise failures[0]
    return [answers[index] for index in range(len(fires))]


def _fire_together(
    session: Session, fires: list[Fire], grace_s: float
) -> tuple[dict[int, dict[str, Any]], list[int], Effects]:
    """Start the runs of the slots whose fire only claims the slot and starts a run; the indexes
    of the others (to fire alone, after this commits) and what to send come back with the answers."""
    now, effects = utcnow(), Effects()
    names = sorted({slot.name for slot in fires if slot.trigger is not Trigger.RETRY})
    # Locked in id order: two batches sharing schedules wait for each other instead of deadlocking.
    rows = (
        session.execute(
            select(*_FIRE_COLUMNS).where(Schedule.name.in_(names)).order_by(Schedule.id).with_for_update()
        ).all()
        if names
        else []
    )
    row_of = {row.name: row for row in rows}
    found = {
        row.name: BatchSchedule(
            ScheduleState(row.status, row.current_retry, row.retry_at, row.last_slot_at),
            cadence_of(EntryFields(*row[_ENTRY_AT:])),
            row.overlap,
            has_calendar=row.calendar is not None,
            late_after_s=_late_after_s(row.catchup, grace_s),
        )
        for row in rows
    }
    plan = decide_batchable(fires, found, now=now)
    if plan.exclusive:
        index_of = {row_of[fires[index].name].id: index for index in plan.exclusive}
        busy = session.scalars(_ACTIVE_OF.where(ScheduleExecution.schedule_id.in_(index_of)))
        plan = plan.without_busy({index_of[schedule_id] for schedule_id in busy})
    alone = list(plan.alone)
    if not plan.together:
        return {}, alone, effects
    starting = [(index, row_of[fires[index].name]) for index in plan.together]
    claims = [(row.id, fires[index].nominal_at, found[row.name].cadence) for index, row in starting]
    claimed = claimed_slots(session, claims, now)
    if claimed != len(starting):
        raise _ClaimRaced(f"{claimed} of {len(starting)} slots claimed")
    # With their steps in the same statement.
    schedules = {
        schedule.id: schedule
        for schedule in session.scalars(
            select(Schedule).options(joinedload(Schedule.steps)).where(Schedule.id.in_([r.id for _, r in starting]))
        ).unique()
    }
    starts = []
    for index, row in starting:
        slot = fires[index]
        key = run_key(slot.name, slot.trigger, slot.nominal_at)
        starts.append(Start(schedules[row.id], slot.trigger, key, slot.nominal_at))
    answers: dict[int, dict[str, Any]] = {}
    for (index, _), result in zip(starting, start_executions(session, starts, now=now), strict=True):
        effects.merge(result.effects)
        answers[index] = (
            {"execution_id": None, "skipped": result.skipped}
            if result.skipped
            else {"execution_id": result.execution_id, "status": "in_progress"}
        )
    return answers, alone, effects


#: The schedules, of those asked, with a run in progress.
_ACTIVE_OF = select(ScheduleExecution.schedule_id).where(ScheduleExecution.status == ExecutionStatus.IN_PROGRESS)


class _ClaimRaced(ChordbeatError):
    """A claimed slot moved under the row lock: the batch is rolled back and fired slot by slot."""


_FIRE_COLUMNS = (
    Schedule.id,
    Schedule.overlap,
    Schedule.current_retry,
    Schedule.last_slot_at,
    Schedule.alerts,
    Schedule.calendar,
    Schedule.catchup,
    # What the cadence is made of, in EntryFields' order.
    *ENTRY_COLUMNS,
)
#: Where EntryFields' columns start in a row of _FIRE_COLUMNS.
_ENTRY_AT = len(_FIRE_COLUMNS) - len(ENTRY_COLUMNS)


def _late_after_s(catchup: dict[str, Any] | None, grace_s: float) -> float | None:
    """For a ``catchup: none`` schedule, how late its slot may fire and still run; else ``None``."""
    return grace_s if policy_of(CatchupRules.from_json(catchup)) is CatchupPolicy.NONE else None


def _fire(app: Runtime, name: str, *, nominal_at: datetime, trigger: Trigger, effects: Effects) -> dict[str, Any]:
    """Decide and record the fire; what must be sent once it committed is added to ``effects``.

    Only a fire that starts a run loads the schedule with its steps: a skip (the previous run is
    still active) is three statements, since under overload most fires are skips.
    """
    now = utcnow()
    with transaction(app.settings.database_url) as session:
        # The row lock orders this fire after any run of the schedule that is ending right now.
        row = session.execute(select(*_FIRE_COLUMNS).where(Schedule.name == name).with_for_update()).first()
        if row is None:
            logger.info("fire of %r ignored: the schedule no longer exists", name)
            # Its entry outlived it (the delete's sync failed): remove it now, not at a full reconcile.
            effects.resync.append(name)
            return {"execution_id": None, "skipped": "schedule does not exist"}
        owner = SlotOwner(row.id, row.name, row.alerts)
        cadence = cadence_of(EntryFields(*row[_ENTRY_AT:]))
        catchup = CatchupRules.from_json(row.catchup)
        state = ScheduleState(row.status, row.current_retry, row.retry_at, row.last_slot_at)
        decision = decide_fire(state, trigger=trigger, nominal_at=nominal_at, now=now, cadence=cadence)
        excluded = partial(slot_calendar_reason, app.settings.calendars_dir, row.calendar, row.timezone)
        move = mover(app.settings.calendars_dir, row.calendar, row.timezone, cadence.dst, nominal_at)
        decision = decide_calendar(decision, partial(excluded, nominal_at), move)
        grace_s = app.settings.alert_missed_grace_s
        decision = decide_late(decision, too_late(catchup, nominal_at=nominal_at, now=now, grace_s=grace_s))
        # The slots a ``catchup: all`` makes up: their backfill is made once the fired slot's run
        # started (it goes first), whatever becomes of it.
        make_up: tuple[datetime, ...] = ()
        if decision.claims_slot:
            if not claim_slot(session, row.id, cadence, nominal_at, now):
                return {"execution_id": None, "skipped": "duplicate"}
            unfired = (state.last_slot_at, nominal_at)
            superseded = decision.outcome is SlotOutcome.SKIPPED_SUPERSEDED
            make_up = record_unfired(
                session, owner, cadence, catchup, unfired, trigger, now, excluded, superseded=superseded
            )
        elif decision.outcome is SlotOutcome.SKIPPED_SUPERSEDED and recorded(session, row.id, nominal_at):
            return {"execution_id": None, "skipped": decision.reason}  # a later fire recorded it as missed
        if decision.outcome is not None and nominal_at not in make_up:  # a made-up one's is start_catchup's
            record_slot(
                session,
                owner,
                decision.outcome,
                trigger=trigger,
                nominal_at=nominal_at,
                now=now,
                detail=decision.reason,
            )
        effects.merge(start_moved(session, owner, decision, nominal_at, now))
        if not decision.start:
            logger.info("fire of %r for %s: %s", name, nominal_at.isoformat(), decision.reason)
            if state.status is not ScheduleStatus.ACTIVE:
                # An entry left behind by a pause, done or dead whose sync failed goes now.
                effects.resync.append(name)
            effects.merge(start_catchup(session, owner, make_up, trigger, now, nominal_at))
            return {"execution_id": None, "skipped": decision.reason}
        checked = trigger is not Trigger.RETRY and row.overlap is Overlap.SKIP
        if checked:
            # The row lock is held: no run of this schedule starts or ends until commit.
            active, backfill = session.execute(_ACTIVE_RUN, {"p_schedule_id": row.id}).one()
            # A backfill's run costs no regular slot its run: start_execution buffers the slot.
            checked = backfill is None
            if active is not None and backfill is None:
                overlap = decide_overlap(row.overlap, trigger, active_id=active, current_retry=row.current_retry)
                assert overlap.outcome is SlotOutcome.SKIPPED_OVERLAP  # what ``skip`` does to a regular slot
                record_slot(
                    session,
                    owner,
                    overlap.outcome,
                    trigger=trigger,
                    nominal_at=nominal_at,
                    now=now,
                    detail=overlap.detail,
                )
                effects.skipped_overlap += 1
                logger.info("schedule %r: %s, run skipped", name, overlap.detail)
                effects.merge(start_catchup(session, owner, make_up, trigger, now, nominal_at))
                return {"execution_id": None, "skipped": overlap.skipped}
        # With its steps in the same statement (their relationship alone would load them in a second).
        schedule = session.get_one(Schedule, row.id, options=(joinedload(Schedule.steps),))
        if trigger is Trigger.RETRY and schedule.retry_at is not None:
            # The stored time names the retry (the message's may be a microsecond off).
            nominal_at = schedule.retry_at
            # The retry replaced the regular slots due meanwhile: they were not missed. Those no
            # fire processed yet (it came late: the control workers were busy or down) say so
            # here; their fires, when they come, find them decided.
            since = state.last_slot_at or schedule.updated_at
            replaced = cadence.latest_slot(now, since=since)
            if replaced is not None and claim_slot(session, row.id, cadence, replaced, now):
                detail = f"retry {schedule.current_retry} replaced this run"
                record_missed(
                    session,
                    owner,
                    cadence,
                    (since, cadence.slot_after(replaced)),
                    regular_trigger(row.every_s),
                    now,
                    excluded,
                    lambda _slot: detail,
                    outcome=SlotOutcome.RETRY,
                )
        result = start_execution(
            session,
            schedule,
            trigger=trigger,
            now=now,
            nominal_at=nominal_at,
            run_key=run_key(name, trigger, nominal_at, schedule.current_retry),
            locked=True,  # the row lock taken first
            no_active=checked,
        )
        effects.merge(result.effects)
        effects.merge(start_catchup(session, owner, make_up, trigger, now, nominal_at))
    if result.skipped:
        return {"execution_id": None, "skipped": result.skipped}
    return {"execution_id": result.execution_id, "status": "in_progress"}


#: The schedule's active run, if any, and its backfill if a backfill started it (built once: this
#: runs for every fire).
_ACTIVE_RUN = select(func.min(ScheduleExecution.id), func.max(ScheduleExecution.backfill_id)).where(
    ScheduleExecution.schedule_id == bindparam("p_schedule_id"),
    ScheduleExecution.status == ExecutionStatus.IN_PROGRESS,
)
