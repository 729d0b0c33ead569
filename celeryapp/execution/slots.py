"""What became of each slot of a schedule: its claim by the fire that processes it, and its record
(fired, skipped and why, missed), counted.

Claiming moves the schedule's last processed slot up, in one compare-and-set statement for any
number of schedules: a slot is claimed once, whoever fires it, so a redelivered or doubled fire
message starts nothing. The slots before it that no fire processed are recorded missed.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import bindparam, case, insert, literal, or_, select, update
from sqlalchemy.orm import Session

from celeryapp.domain.cadence import Cadence
from celeryapp.domain.times import iso
from celeryapp.monitoring import metric_counts
from celeryapp.monitoring.alert_outbox import MISSED_OUTCOMES, alert_missed_slots
from models import Schedule, SlotOutcome, SlotRecord, Trigger
from models.session import affected
from models.tables import SLOT_RECORDS

#: The slot the buffer holds, and its trigger: the newest slot recorded buffered (a buffer keeps
#: one run, for the latest slot that met the active one; a manual run's has none, a rerun's that of
#: the run it repeats). Read newest first along the schedule's slot record index: the record is
#: among the last few, written while the run was on.
BUFFERED_SLOT = (
    select(SlotRecord.nominal_at, SlotRecord.trigger)
    .where(
        SlotRecord.schedule_name == bindparam("p_name"),
        SlotRecord.outcome == SlotOutcome.BUFFERED,
        SlotRecord.trigger.in_((Trigger.CRON, Trigger.INTERVAL, Trigger.MANUAL)),
    )
    .order_by(SlotRecord.id.desc())
    .limit(1)
)


class SlotOwner(NamedTuple):
    """The schedule a slot record belongs to (what a fire reads without loading the schedule)."""

    id: int
    name: str
    #: Its ``alerts`` object: a skip or miss raises ``missed`` without reading the schedule again.
    alerts: dict[str, Any] | None = None


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
    record_slots(session, [SlotRow(schedule, outcome, trigger, nominal_at, execution_id, detail)], now=now)


class SlotRow(NamedTuple):
    """What :func:`record_slots` records of one slot."""

    owner: Schedule | SlotOwner
    outcome: SlotOutcome
    trigger: Trigger
    nominal_at: datetime | None
    execution_id: int | None = None
    detail: str | None = None


def record_slots(session: Session, slots: list[SlotRow], *, now: datetime) -> None:
    """Record what became of slots, and count them, in one statement each."""
    rows = [
        {
            "schedule_id": slot.owner.id,
            "schedule_name": slot.owner.name,
            "nominal_at": slot.nominal_at,
            "trigger": slot.trigger,
            "outcome": slot.outcome,
            "execution_id": slot.execution_id,
            "detail": slot.detail,
            "recorded_at": now,
        }
        for slot in slots
    ]
    session.connection().execute(_INSERT_SLOT, rows)
    counts = metric_counts.Counts()
    for slot in slots:
        counts.count(metric_counts.SLOTS, slot.owner.name, slot.outcome.value)
    counts.add_to(session)
    # Schedules without alerts (most) cost nothing more.
    missed = [
        (s.owner.name, s.outcome, s.nominal_at, s.detail, s.owner.alerts)
        for s in slots
        if s.outcome in MISSED_OUTCOMES and s.owner.alerts
    ]
    if missed:
        alert_missed_slots(session, missed, now=now)


_INSERT_SLOT = insert(SLOT_RECORDS)


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
    outcome: SlotOutcome = SlotOutcome.MISSED,
) -> None:
    """Record the regular slots after ``since`` (the last one processed) and before ``until`` that no
    fire ever processed, so "why didn't it run at 02:00?" has an answer (one its calendar excludes
    would not have run anyway: it is recorded skipped_calendar, not missed). ``missed`` gives a
    missed slot's detail: what its catch-up policy made of it. ``outcome``: what became of them,
    missed unless something else took their place (a retry)."""
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
        became, reason = outcome, excluded(slot) if count < MAX_MISSED_RECORDS else None
        if reason is not None:
            became, detail = SlotOutcome.SKIPPED_CALENDAR, f"not run: {reason}"
        record_slot(session, owner, became, trigger=trigger, nominal_at=slot, now=now, detail=detail)
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
