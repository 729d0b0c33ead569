"""Backfills in the database: made with their first runs, driven on as their runs end, cancelled.

A backfill's row holds its slots (oldest first) and how many started; the next to start is
``slots[started]``. Every start happens under the schedule's row lock, in the transaction of
what made room for it (the backfill's creation, the end of a run, recovery's pass), and moves
``started`` with a compare-and-set: a crash between two commits loses nothing, since the row
says what started and recovery's pass starts the rest.

With the schedule's other runs: an exclusive schedule's backfill run starts only when no run of
the schedule is in progress or buffered (a regular slot meeting a backfill run is buffered, and
runs first when it ends); an ``allow`` schedule's run beside the regular ones.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import func, select, text, update
from sqlalchemy.orm import Session

from celeryapp.domain.effects import Effects
from celeryapp.execution.backfill_driver import drive
from celeryapp.execution.runs import lock_schedule, start_execution
from celeryapp.execution.slots import BUFFERED_SLOT
from models import (
    Backfill,
    BackfillOrigin,
    BackfillStatus,
    ExecutionStatus,
    Schedule,
    ScheduleExecution,
    ScheduleStep,
    SlotOutcome,
    SlotRecord,
)
from models.session import affected

logger = logging.getLogger(__name__)


@dataclass
class BackfillStart:
    """A backfill made: its id, and what to send once the transaction committed."""

    backfill_id: int
    effects: Effects = field(default_factory=Effects)


def stored_slot(slot: datetime) -> str:
    """A slot as the row stores it: exact to the microsecond (an interval's slots need it)."""
    return slot.isoformat()


def create_backfill(
    session: Session,
    schedule: Schedule | int,
    slots: list[datetime],
    *,
    origin: BackfillOrigin,
    max_concurrent: int,
    now: datetime,
    actor: str | None = None,
    reason: str | None = None,
    mode: str = "catchup",
    request_key: str | None = None,
    span: tuple[datetime, datetime] | None = None,
    not_before: datetime | None = None,
    version: int | None = None,
) -> BackfillStart:
    """Make a backfill of ``slots`` (aware, oldest first, at least one) and start its first runs.

    Takes the schedule's row lock (a caller holding it already, as the fire does, loses nothing).
    ``origin`` CATCHUP: the runs keep the schedule's own trigger and the regular run key, so a
    make-up run and a late fire of the same slot cannot both run. ``request_key``: the caller
    checked that no running backfill has it. ``span``: the requested range (start, end); a
    catch-up's is its first slot and its last. ``not_before``: no slot starts before then (origin
    MOVED: the run waits for the next business day's wall time; recovery's pass starts it within
    its interval after, or any run end or fire of the schedule before that). ``version``: the
    definition version its runs run (None: the current one when each starts).
    """
    if not slots:
        raise ValueError("a backfill needs at least one slot")
    schedule_id = schedule if isinstance(schedule, int) else schedule.id
    lock_schedule(session, schedule_id)
    name = session.scalar(select(Schedule.name).where(Schedule.id == schedule_id))
    if name is None:
        raise LookupError(f"schedule {schedule_id} does not exist")
    row = Backfill(
        schedule_id=schedule_id,
        schedule_name=name,
        origin=origin,
        mode=mode,
        version=version,
        range_start=span[0] if span else slots[0],
        range_end=span[1] if span else slots[-1],
        slots=[stored_slot(slot) for slot in slots],
        started=0,
        max_concurrent=max_concurrent,
        not_before=not_before,
        status=BackfillStatus.RUNNING,
        request_key=request_key,
        actor=actor,
        reason=reason,
        created_at=now,
    )
    session.add(row)
    session.flush()
    logger.info("backfill %s of %r: %s slots, %s at a time", row.id, name, len(slots), max_concurrent)
    return BackfillStart(row.id, drive_backfills(session, schedule_id, now=now))


def drive_backfills(session: Session, schedule_id: int, *, now: datetime) -> Effects:
    """Start what the schedule's running backfills may start now (the caller holds its row lock)."""
    return drive(session, schedule_id, now=now, start=start_execution)


def cancel_backfill(session: Session, backfill_id: int, *, now: datetime) -> Backfill | None:
    """Cancel what has not started (runs in progress go on); ``None`` if there is no such backfill.
    A backfill already ended is left as it is."""
    schedule_id = session.scalar(select(Backfill.schedule_id).where(Backfill.id == backfill_id))
    if schedule_id is not None:
        lock_schedule(session, schedule_id)
    session.execute(
        update(Backfill)
        .where(Backfill.id == backfill_id, Backfill.status == BackfillStatus.RUNNING)
        .values(status=BackfillStatus.CANCELLED, finished_at=now, request_key=None)
        .execution_options(synchronize_session=False)
    )
    return session.get(Backfill, backfill_id, populate_existing=True)


def cancel_backfills_of(session: Session, schedule_id: int | None, *, now: datetime) -> int:
    """Cancel the schedule's running backfills (it is being deleted); ``None``: those whose
    schedule was deleted already (recovery's pass). How many."""
    of = Backfill.schedule_id.is_(None) if schedule_id is None else Backfill.schedule_id == schedule_id
    return affected(
        session,
        update(Backfill)
        .where(of, Backfill.status == BackfillStatus.RUNNING)
        .values(status=BackfillStatus.CANCELLED, finished_at=now, request_key=None)
        .execution_options(synchronize_session=False),
    )


def backfilling_schedules(session: Session) -> list[int]:
    """The schedules with a running backfill (recovery's pass drives each)."""
    return list(
        session.scalars(
            select(Backfill.schedule_id)
            .where(Backfill.status == BackfillStatus.RUNNING, Backfill.schedule_id.is_not(None))
            .distinct()
        )
    )


@dataclass(frozen=True)
class SlotFacts:
    """What the schedule's runs say of the slots of a range (see ``choose_slots``)."""

    ran: frozenset[datetime]
    latest_failed: frozenset[datetime]
    busy: frozenset[datetime]


def slot_facts(session: Session, schedule_id: int, start: datetime, end: datetime) -> SlotFacts:
    """Which slots in ``start ≤ slot < end`` ran, whose latest run failed or was cancelled, and
    which are busy (a run in progress, buffered behind one, or queued in a running backfill of
    the schedule)."""
    in_range = (
        ScheduleExecution.schedule_id == schedule_id,
        ScheduleExecution.slot >= start,
        ScheduleExecution.slot < end,
    )
    latest: dict[datetime, ExecutionStatus] = {}
    for slot, status in session.execute(
        select(ScheduleExecution.slot, ScheduleExecution.status).where(*in_range).order_by(ScheduleExecution.id)
    ):
        if slot is not None:
            latest[slot] = status
    # Runs from before runs stored their slot are known by their slot record.
    fired = session.scalars(
        select(SlotRecord.nominal_at).where(
            SlotRecord.schedule_id == schedule_id,
            SlotRecord.outcome == SlotOutcome.FIRED,
            SlotRecord.nominal_at >= start,
            SlotRecord.nominal_at < end,
        )
    )
    queued: set[datetime] = set()
    for slots, started in session.execute(
        select(Backfill.slots, Backfill.started).where(
            Backfill.schedule_id == schedule_id, Backfill.status == BackfillStatus.RUNNING
        )
    ):
        queued.update(datetime.fromisoformat(slot) for slot in slots[started:])
    name, buffered = session.execute(select(Schedule.name, Schedule.buffered).where(Schedule.id == schedule_id)).one()
    if buffered:
        # Its run starts when the active one ends (under the slot's own key, see runs.py).
        slot, _trigger = session.execute(BUFFERED_SLOT, {"p_name": name}).first() or (None, None)
        if slot is not None:
            queued.add(slot)
    ended_badly = {ExecutionStatus.FAILED, ExecutionStatus.CANCELLED}
    return SlotFacts(
        ran=frozenset(latest) | frozenset(slot for slot in fired if slot is not None),
        latest_failed=frozenset(slot for slot, status in latest.items() if status in ended_badly),
        busy=frozenset(slot for slot, status in latest.items() if status is ExecutionStatus.IN_PROGRESS)
        | frozenset(queued),
    )


def running_request(session: Session, key: str) -> Backfill | None:
    """The running backfill the same request made, if any."""
    return session.scalar(select(Backfill).where(Backfill.request_key == key))


#: Any number names the advisory lock; every request for a backfill takes it (see below).
_BACKFILL_TOTALS_LOCK = 0x6266_636E  # "bfcn"


def lock_backfill_totals(session: Session) -> None:
    """Serialise the requests that check the deployment's pending slots until commit: two requests
    for different schedules hold different row locks and would both pass the bound. SQLite's
    writers exclude each other already. Taken after the schedule's row lock, never before it."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _BACKFILL_TOTALS_LOCK})


def pending_slots(session: Session, schedule_id: int | None = None) -> int:
    """Slots of running backfills (and catch-ups) not started yet: of one schedule, or of all.
    Counted by the database: the slot lists are never loaded."""
    query = select(func.coalesce(func.sum(func.json_array_length(Backfill.slots) - Backfill.started), 0)).where(
        Backfill.status == BackfillStatus.RUNNING
    )
    if schedule_id is not None:
        query = query.where(Backfill.schedule_id == schedule_id)
    return int(session.scalar(query) or 0)


def steps_per_run(session: Session, schedule_id: int) -> int:
    """The steps of the schedule's plan: what one of its runs queues at least."""
    count = session.scalar(
        select(func.count()).select_from(ScheduleStep).where(ScheduleStep.schedule_id == schedule_id)
    )
    return int(count or 0)
