"""What a beat entry's fire message does: start the run of one nominal slot, or record why not."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import bindparam, func, or_, select, update
from sqlalchemy.orm import Session, joinedload

from celeryapp.errors import InvalidArgument
from celeryapp.execution.decisions import ScheduleState, decide_fire
from celeryapp.execution.effects import Effects
from celeryapp.execution.runs import SlotOwner, record_slot, run_key, start_execution
from celeryapp.interfaces.views import iso
from celeryapp.messaging.dispatch import apply_effects
from celeryapp.scheduling.beat_entries import ENTRY_COLUMNS, EntryFields, cadence_of
from celeryapp.scheduling.cadence import Cadence
from celeryapp.scheduling.limits import MAX_NAME_CHARS, shown
from models import (
    ExecutionStatus,
    Overlap,
    Schedule,
    ScheduleExecution,
    ScheduleStatus,
    SlotOutcome,
    SlotRecord,
    Trigger,
    transaction,
    utcnow,
)
from models.session import affected

if TYPE_CHECKING:
    from celeryapp.app import ChordbeatCelery

logger = logging.getLogger(__name__)


#: A fire message's slot may lie this far in the future of the worker's clock (beat's clock skew);
#: further, it is forged: claiming it would make every real slot before it look superseded.
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
            raise InvalidArgument("trigger", f"must be one of {choices}, got {shown(trigger)}")
        kind = Trigger(trigger)
    if nominal_at is None:
        return name, now, kind
    try:
        when = datetime.fromisoformat(nominal_at) if isinstance(nominal_at, str) and len(nominal_at) <= 40 else None
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise InvalidArgument("nominal_at", f"must be an ISO 8601 time with its UTC offset, got {shown(nominal_at)}")
    if when > now + MAX_SLOT_AHEAD:
        raise InvalidArgument(
            "nominal_at", f"{when.isoformat()} is in the future; a fire stands for a slot that is due"
        )
    return name, when, kind


def fire(app: ChordbeatCelery, name: str, *, nominal_at: datetime, trigger: Trigger) -> dict[str, Any]:
    effects = Effects()
    answer = _fire(app, name, nominal_at=nominal_at, trigger=trigger, effects=effects)
    apply_effects(app, effects)
    return answer


_FIRE_COLUMNS = (
    Schedule.id,
    Schedule.overlap,
    Schedule.current_retry,
    Schedule.last_slot_at,
    # What the cadence is made of, in EntryFields' order.
    *ENTRY_COLUMNS,
)


def _fire(
    app: ChordbeatCelery, name: str, *, nominal_at: datetime, trigger: Trigger, effects: Effects
) -> dict[str, Any]:
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
        owner = SlotOwner(row.id, row.name)
        cadence = cadence_of(EntryFields(*row[4:]))
        state = ScheduleState(row.status, row.current_retry, row.retry_at, row.last_slot_at)
        decision = decide_fire(state, trigger=trigger, nominal_at=nominal_at, now=now, cadence=cadence)
        if decision.claims_slot:
            if not _claim_slot(session, row.id, cadence, nominal_at, now):
                return {"execution_id": None, "skipped": "duplicate"}
            _record_missed(
                session, owner, cadence, since=state.last_slot_at, until=nominal_at, trigger=trigger, now=now
            )
        elif decision.outcome is SlotOutcome.SKIPPED_SUPERSEDED and _recorded(session, row.id, nominal_at):
            return {"execution_id": None, "skipped": decision.reason}  # a later fire recorded it as missed
        if decision.outcome is not None:
            record_slot(
                session,
                owner,
                decision.outcome,
                trigger=trigger,
                nominal_at=nominal_at,
                now=now,
                detail=decision.reason,
            )
        if not decision.start:
            logger.info("fire of %r for %s: %s", name, nominal_at.isoformat(), decision.reason)
            if state.status is not ScheduleStatus.ACTIVE:
                # An entry left behind by a pause, done or dead whose sync failed goes now.
                effects.resync.append(name)
            return {"execution_id": None, "skipped": decision.reason}
        checked = trigger is not Trigger.RETRY and row.overlap is Overlap.SKIP
        if checked:
            # The row lock is held: no run of this schedule starts or ends until commit.
            active = session.scalar(_ACTIVE_RUN, {"p_schedule_id": row.id})
            if active is not None:
                running = f"execution {active} is in progress"
                record_slot(
                    session,
                    owner,
                    SlotOutcome.SKIPPED_OVERLAP,
                    trigger=trigger,
                    nominal_at=nominal_at,
                    now=now,
                    detail=running,
                )
                effects.skipped_overlap += 1
                logger.info("schedule %r: %s, run skipped", name, running)
                return {"execution_id": None, "skipped": f"overlap: {running}"}
        # With its steps in the same statement (their relationship alone would load them in a second).
        schedule = session.get_one(Schedule, row.id, options=(joinedload(Schedule.steps),))
        if trigger is Trigger.RETRY and schedule.retry_at is not None:
            # The stored time names the retry (the message's may be a microsecond off).
            nominal_at = schedule.retry_at
            # The retry replaced the regular slots due meanwhile: they were not missed.
            replaced = cadence.latest_slot(now, since=state.last_slot_at or schedule.updated_at)
            if replaced is not None:
                _claim_slot(session, row.id, cadence, replaced, now)
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
    if result.skipped:
        return {"execution_id": None, "skipped": result.skipped}
    return {"execution_id": result.execution_id, "status": "in_progress"}


#: The schedule's active run, if any (built once: this runs for every fire).
_ACTIVE_RUN = select(func.min(ScheduleExecution.id)).where(
    ScheduleExecution.schedule_id == bindparam("p_schedule_id"),
    ScheduleExecution.status == ExecutionStatus.IN_PROGRESS,
)


#: Missed slots one fire records at most; after long downtime the last record sums up the rest.
MAX_MISSED_RECORDS = 50
MISSED = "not fired: beat, Redis or the workers were down, or its fire message was lost; no make-up run"


def _record_missed(
    session: Session,
    owner: SlotOwner,
    cadence: Cadence,
    *,
    since: datetime | None,
    until: datetime,
    trigger: Trigger,
    now: datetime,
) -> None:
    """Record the regular slots after ``since`` (the last one processed) and before ``until`` that no
    fire ever processed, so "why didn't it run at 02:00?" has an answer."""
    if since is None:
        return
    slot = cadence.slot_after(since)
    for count in range(MAX_MISSED_RECORDS + 1):
        if slot >= until:
            return
        detail = MISSED if count < MAX_MISSED_RECORDS else f"{MISSED}; nor were the later slots until {iso(until)}"
        record_slot(session, owner, SlotOutcome.MISSED, trigger=trigger, nominal_at=slot, now=now, detail=detail)
        slot = cadence.slot_after(slot)


def _recorded(session: Session, schedule_id: int, nominal_at: datetime) -> bool:
    return (
        session.scalar(
            select(SlotRecord.id)
            .where(SlotRecord.schedule_id == schedule_id, SlotRecord.nominal_at == nominal_at)
            .limit(1)
        )
        is not None
    )


def _claim_slot(session: Session, schedule_id: int, cadence: Cadence, nominal_at: datetime, now: datetime) -> bool:
    """Move the schedule's last processed slot up to ``nominal_at``; False if it is there already."""
    return bool(
        affected(
            session,
            update(Schedule)
            .where(
                Schedule.id == schedule_id,
                or_(Schedule.last_slot_at.is_(None), Schedule.last_slot_at < nominal_at),
            )
            .values(last_slot_at=nominal_at, next_run_at=cadence.slot_after(max(now, nominal_at)))
            .execution_options(synchronize_session=False),
        )
    )
