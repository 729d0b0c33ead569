"""The slot record of a paused schedule: each due time that passes while it is paused gets a
``skipped_paused`` row saying who paused it and why, written by the periodic recovery pass (so
within ``CHORDBEAT_RECOVERY_INTERVAL``) and, for the slots since the last pass, by the resume.

While a schedule is paused its ``last_slot_at`` is the last slot recorded (nothing fires it, and a
resume forgets it), moved by compare-and-set so two passes never record a slot twice.
"""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from celeryapp.domain.cadence import Cadence, cadence_of
from celeryapp.domain.times import iso
from celeryapp.execution.slots import SlotRow, record_slots
from celeryapp.scheduling.store import find_schedule
from models import Schedule, ScheduleStatus, SlotOutcome, SlotRecord, Trigger, transaction
from models.session import affected, retried_transaction

logger = logging.getLogger(__name__)

#: Rows one schedule gets per pass at most; the last one then sums up the slots after it (as a
#: fire's missed-slot record does), so a long pause of a fast schedule cannot flood the table.
MAX_PAUSED_RECORDS = 50


def paused_detail(schedule: Schedule) -> str:
    """``paused by <actor>: <reason>``, each part only when known (a file's ``enabled: false``
    has a reason and no actor)."""
    by = f" by {schedule.paused_by}" if schedule.paused_by else ""
    said = f": {schedule.paused_reason}" if schedule.paused_reason else ""
    return f"paused{by}{said}"


def _since(schedule: Schedule) -> datetime | None:
    """The instant after which the paused slots are not recorded yet (unknown for a schedule
    paused before the pause time was kept: nothing is recorded for it)."""
    marks = [t for t in (schedule.paused_at, schedule.last_slot_at) if t is not None]
    return max(marks) if schedule.paused_at is not None else None


def record_paused_slots(session: Session, schedule: Schedule, *, now: datetime) -> int:
    """Record the paused schedule's slots due by ``now`` not recorded yet; the number of rows.

    The caller holds the schedule's row lock (or accepts that a concurrent pass wins the
    compare-and-set and this one records nothing)."""
    since = _since(schedule) if schedule.status is ScheduleStatus.PAUSED else None
    if since is None:
        return 0
    cadence = cadence_of(schedule)
    slots, more = cadence.slots_between(since, now, MAX_PAUSED_RECORDS)
    if not slots:
        return 0
    last = (cadence.latest_slot(now, since=slots[-1]) or slots[-1]) if more else slots[-1]
    moved = update(Schedule).where(
        Schedule.id == schedule.id,
        Schedule.status == ScheduleStatus.PAUSED,
        Schedule.last_slot_at.is_not_distinct_from(schedule.last_slot_at),
    )
    if not affected(session, moved.values(last_slot_at=last).execution_options(synchronize_session=False)):
        return 0  # another pass recorded them, or the schedule was resumed meanwhile
    # A fire message already on its way when the pause came records its slot itself.
    known = set(
        session.scalars(
            select(SlotRecord.nominal_at).where(
                SlotRecord.schedule_id == schedule.id, SlotRecord.nominal_at > since, SlotRecord.nominal_at <= last
            )
        )
    )
    detail = paused_detail(schedule)
    trigger = Trigger.CRON if schedule.cron else Trigger.INTERVAL
    rows = [
        SlotRow(schedule, SlotOutcome.SKIPPED_PAUSED, trigger, slot, None, detail)
        for slot in slots
        if slot not in known
    ]
    if more and rows:
        summed = f"{detail}; so were the later slots until {iso(last)}"
        rows[-1] = rows[-1]._replace(detail=summed)
    if rows:
        record_slots(session, rows, now=now)
    session.refresh(schedule)
    return len(rows)


def _due(cadence: Cadence, since: datetime | None, now: datetime) -> bool:
    return since is not None and cadence.slot_after(since) <= now


def record_all_paused(database_url: str, *, now: datetime) -> list[str]:
    """One pass over the paused schedules: the names of those that got rows. Each schedule has its
    own short transaction, opened only when one of its slots is due (read first, unlocked)."""
    with transaction(database_url, read_only=True) as session:
        paused = [
            s.name
            for s in session.scalars(
                select(Schedule).where(Schedule.status == ScheduleStatus.PAUSED, Schedule.paused_at.is_not(None))
            )
            if _due(cadence_of(s), _since(s), now)
        ]
    recorded: list[str] = []
    for name in paused:

        def record(session: Session, name: str = name) -> int:
            return record_paused_slots(session, find_schedule(session, name, lock=True), now=now)

        try:
            if retried_transaction(database_url, f"recording paused slots of {name!r}", record):
                recorded.append(name)
        except Exception:
            # One schedule's failure (deleted meanwhile, say) must not cost the others their rows.
            logger.exception("paused slots of schedule %r not recorded; the others are", name)
    return recorded
