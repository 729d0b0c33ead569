"""A fire's claim of its slot, and the record of the slots before it that no fire processed.

Claiming moves the schedule's last processed slot up, in one compare-and-set statement for any
number of schedules: a slot is claimed once, whoever fires it, so a redelivered or doubled fire
message starts nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from sqlalchemy import case, literal, or_, select, update
from sqlalchemy.orm import Session

from celeryapp.domain.cadence import Cadence
from celeryapp.domain.times import iso
from celeryapp.execution.slot_records import SlotOwner, record_slot
from models import Schedule, SlotOutcome, SlotRecord, Trigger
from models.session import affected


def claimed_slots(session: Session, claims: list[tuple[int, datetime, Cadence]], now: datetime) -> int:
    """Move each schedule's last processed slot up to its claimed one, in one statement; how many
    moved (one that is there already does not)."""
    column = Schedule.__table__.c
    nominal = case(
        {schedule_id: literal(at, column.last_slot_at.type) for schedule_id, at, _ in claims}, value=Schedule.id
    )
    following = case(
        {
            schedule_id: literal(cadence.slot_after(max(now, at)), column.next_run_at.type)
            for schedule_id, at, cadence in claims
        },
        value=Schedule.id,
    )
    return affected(
        session,
        update(Schedule)
        .where(
            Schedule.id.in_([schedule_id for schedule_id, _, _ in claims]),
            or_(Schedule.last_slot_at.is_(None), Schedule.last_slot_at < nominal),
        )
        .values(last_slot_at=nominal, next_run_at=following)
        .execution_options(synchronize_session=False),
    )


#: Missed slots one fire records at most; after long downtime the last record sums up the rest.
MAX_MISSED_RECORDS = 50


def record_missed(
    session: Session,
    owner: SlotOwner,
    cadence: Cadence,
    between: tuple[datetime | None, datetime],
    trigger: Trigger,
    now: datetime,
    excluded: Callable[[datetime], str | None],
    missed: Callable[[datetime], str],
) -> None:
    """Record the regular slots after ``since`` (the last one processed) and before ``until`` that no
    fire ever processed, so "why didn't it run at 02:00?" has an answer (one its calendar excludes
    would not have run anyway: it is recorded skipped_calendar, not missed). ``missed`` gives a
    missed slot's detail: what its catch-up policy made of it."""
    since, until = between
    if since is None:
        return
    slot = cadence.slot_after(since)
    for count in range(MAX_MISSED_RECORDS + 1):
        if slot >= until:
            return
        detail = missed(slot)
        if count == MAX_MISSED_RECORDS:
            detail = f"{detail}; nor were the later slots until {iso(until)}"
        outcome, reason = SlotOutcome.MISSED, excluded(slot) if count < MAX_MISSED_RECORDS else None
        if reason is not None:
            outcome, detail = SlotOutcome.SKIPPED_CALENDAR, f"not run: {reason}"
        record_slot(session, owner, outcome, trigger=trigger, nominal_at=slot, now=now, detail=detail)
        slot = cadence.slot_after(slot)


def recorded(session: Session, schedule_id: int, nominal_at: datetime) -> bool:
    return (
        session.scalar(
            select(SlotRecord.id)
            .where(SlotRecord.schedule_id == schedule_id, SlotRecord.nominal_at == nominal_at)
            .limit(1)
        )
        is not None
    )


def claim_slot(session: Session, schedule_id: int, cadence: Cadence, nominal_at: datetime, now: datetime) -> bool:
    """Move the schedule's last processed slot up to ``nominal_at``; False if it is there already."""
    return claimed_slots(session, [(schedule_id, nominal_at, cadence)], now) == 1
