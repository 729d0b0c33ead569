"""The backfill driver: what a schedule's running backfills may start now, started.

Every start happens under the schedule's row lock, in the transaction of what made room for it
(a backfill's creation, the end of a run, recovery's pass), and moves the backfill's ``started``
with a compare-and-set: a crash between two commits loses nothing, since the row says what
started and recovery's pass starts the rest.

The runs are started with the function the caller passes (the execution's start, whose end
drives the backfill on: one loop, two modules, no import cycle).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import exists, func, select, update
from sqlalchemy.orm import Session, defer, joinedload

from celeryapp.domain.backfill_slots import backfill_run_key
from celeryapp.domain.effects import Effects
from celeryapp.domain.names import run_key
from celeryapp.domain.times import iso
from celeryapp.execution.run_rows import StartResult, execution_with_key
from models import (
    Backfill,
    BackfillOrigin,
    BackfillStatus,
    ExecutionStatus,
    Overlap,
    Schedule,
    ScheduleExecution,
    ScheduleStatus,
    Trigger,
)
from models.session import affected
from models.versions import PinnedVersion, definition_at

logger = logging.getLogger(__name__)


class Starter(Protocol):
    """:func:`celeryapp.execution.runs.start_execution`."""

    def __call__(
        self,
        session: Session,
        schedule: Schedule,
        *,
        trigger: Trigger,
        run_key: str,
        now: datetime,
        nominal_at: datetime | None = None,
        locked: bool = False,
        backfill_id: int | None = None,
        detail: str | None = None,
        pinned: PinnedVersion | None = None,
    ) -> StartResult: ...


def regular_trigger(every_s: float | None) -> Trigger:
    """The trigger of a schedule's regular runs."""
    return Trigger.INTERVAL if every_s is not None else Trigger.CRON


#: A schedule's running backfills, oldest first, without their slots (see :func:`_slots_of`).
_RUNNING = (
    select(Backfill)
    .options(defer(Backfill.slots))
    .where(Backfill.status == BackfillStatus.RUNNING)
    .order_by(Backfill.id)
)
#: Backfills whose slots this process keeps (a backfill's slots never change once it is made).
SLOTS_CACHED = 64
_slots_cache: OrderedDict[tuple[str, int, datetime], list[str]] = OrderedDict()
_slots_lock = threading.Lock()


def _slots_of(session: Session, backfill: Backfill) -> list[str]:
    """The backfill's slots, read once per process: each run's end drives the backfill on, and
    reading up to 10,000 slots each time would make a backfill's reads grow with its square.
    Known by database, id and creation time: another database's backfill may have the same id."""
    key = (str(session.connection().engine.url), backfill.id, backfill.created_at)
    with _slots_lock:
        cached = _slots_cache.get(key)
        if cached is not None:
            _slots_cache.move_to_end(key)
            return cached
    slots: list[str] = session.scalar(select(Backfill.slots).where(Backfill.id == backfill.id)) or []
    with _slots_lock:
        _slots_cache[key] = slots
        while len(_slots_cache) > SLOTS_CACHED:
            _slots_cache.popitem(last=False)
    return slots


def has_running_backfill(schedule_id: Any) -> Any:
    """Whether the schedule has a running backfill, as an expression (read with the row a run's end reads)."""
    return exists().where(Backfill.schedule_id == schedule_id, Backfill.status == BackfillStatus.RUNNING)


def drive(session: Session, schedule_id: int, *, now: datetime, start: Starter) -> Effects:
    """Start what the schedule's running backfills may start now; mark the finished ones.

    The caller holds the schedule's row lock.
    """
    effects = Effects()
    backfills = list(session.scalars(_RUNNING.where(Backfill.schedule_id == schedule_id)))
    if not backfills:
        return effects
    schedule = session.get_one(Schedule, schedule_id, options=(joinedload(Schedule.steps),))
    running: dict[int | None, int] = {
        backfill_id: count
        for backfill_id, count in session.execute(
            select(ScheduleExecution.backfill_id, func.count())
            .where(
                ScheduleExecution.schedule_id == schedule_id, ScheduleExecution.status == ExecutionStatus.IN_PROGRESS
            )
            .group_by(ScheduleExecution.backfill_id)
        )
    }
    exclusive = schedule.overlap is not Overlap.ALLOW
    # Paused, done or dead: nothing new starts (a resume continues); an exclusive schedule's
    # regular run in progress or buffered goes first.
    may_start = schedule.status is ScheduleStatus.ACTIVE and not (exclusive and (running or schedule.buffered))
    for backfill in backfills:
        if backfill.not_before is not None and now < backfill.not_before:
            continue  # not due yet: it starts nothing, and holds nothing back
        in_progress = running.get(backfill.id, 0)
        started = backfill.started
        slots = _slots_of(session, backfill)
        while may_start and started < len(slots) and in_progress < backfill.max_concurrent:
            slot = datetime.fromisoformat(slots[started])
            result = _start_slot(session, schedule, backfill, slot, now=now, start=start)
            started += 1
            if result is not None:
                effects.merge(result)
                in_progress += 1
                if exclusive:
                    may_start = False
        finished = started == len(slots) and in_progress == 0
        _advance(session, backfill, started, finished=finished, now=now)
    return effects


def _start_slot(
    session: Session, schedule: Schedule, backfill: Backfill, slot: datetime, *, now: datetime, start: Starter
) -> Effects | None:
    """Start the backfill's run of ``slot``; ``None`` if its run key had made a run already."""
    if backfill.origin is BackfillOrigin.CATCHUP:
        # A missed slot a request (mode all or failed) ran since the catch-up was made has another
        # run key than the catch-up's: looked for by it (unique index).
        other = backfill_run_key(schedule.name, slot, earlier_backfill_runs=0, mode="all")
        if execution_with_key(session, other) is not None:
            logger.info("backfill %s of %r: slot %s ran meanwhile, passed over", backfill.id, schedule.name, iso(slot))
            return None
    if backfill.origin is BackfillOrigin.CATCHUP:
        trigger = regular_trigger(schedule.every_s)
        key = run_key(schedule.name, trigger, slot)
        detail = f"catch-up #{backfill.id}"
    elif backfill.origin is BackfillOrigin.MOVED:
        # A slot its business calendar moved: a run of its own, one per slot however often fired.
        trigger = regular_trigger(schedule.every_s)
        key = f"{schedule.name}:moved:{iso(slot)}"
        detail = f"moved from {iso(slot)}" + (f": {backfill.reason}" if backfill.reason else "")
    else:
        trigger = Trigger.BACKFILL
        if backfill.mode == "missing":
            # A slot that never ran runs under its regular key: a catch-up of it, or its own fire
            # still on its way when the backfill was asked for, and this run are one run whichever
            # comes first (the unique key passes the later over).
            key = run_key(schedule.name, regular_trigger(schedule.every_s), slot)
        else:
            earlier = 0
            if backfill.mode == "failed":
                earlier = (
                    session.scalar(
                        select(func.count()).where(
                            ScheduleExecution.schedule_id == schedule.id,
                            ScheduleExecution.trigger == Trigger.BACKFILL,
                            ScheduleExecution.slot == slot,
                        )
                    )
                    or 0
                )
            key = backfill_run_key(schedule.name, slot, earlier_backfill_runs=earlier, mode=backfill.mode)
        detail = f"backfill #{backfill.id}"
    result = start(
        session,
        schedule,
        trigger=trigger,
        run_key=key,
        now=now,
        nominal_at=slot,
        locked=True,
        backfill_id=backfill.id,
        detail=detail,
        # Checked when the backfill was asked for; a version gone since (its schedule deleted and
        # made again) runs the current definition.
        pinned=None if backfill.version is None else definition_at(session, schedule.id, backfill.version),
    )
    if result.skipped is not None:
        logger.info(
            "backfill %s of %r: slot %s passed over (%s)", backfill.id, schedule.name, iso(slot), result.skipped
        )
        return None
    return result.effects


def _advance(session: Session, backfill: Backfill, started: int, *, finished: bool, now: datetime) -> None:
    if started == backfill.started and not finished:
        return
    values: dict[str, Any] = {"started": started}
    if finished:
        # The request's key is freed: the same request made later is a new backfill.
        values.update(status=BackfillStatus.COMPLETED, finished_at=now, request_key=None)
        logger.info("backfill %s of %r completed", backfill.id, backfill.schedule_name)
    moved = affected(
        session,
        update(Backfill)
        .where(
            Backfill.id == backfill.id, Backfill.started == backfill.started, Backfill.status == BackfillStatus.RUNNING
        )
        .values(**values)
        .execution_options(synchronize_session=False),
    )
    if not moved:
        # Every writer holds the schedule's lock: a change under it is a bug, not a race to lose.
        raise RuntimeError(f"backfill {backfill.id} changed under the schedule's lock")
