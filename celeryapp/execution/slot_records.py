"""What became of each slot of a schedule (fired, skipped and why, missed), recorded and counted."""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import bindparam, insert, select
from sqlalchemy.orm import Session

from celeryapp.monitoring import metric_counts
from celeryapp.monitoring.alert_outbox import MISSED_OUTCOMES, alert_missed_slots
from models import Schedule, SlotOutcome, SlotRecord, Trigger
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
