"""A fire's catch-up: the slots before it that no fire processed, recorded, and for a
``catchup: all`` schedule the newest of them run again, oldest first, one at a time.

The make-up runs are a backfill of origin ``catchup`` (celeryapp/execution/backfills.py) made in
the fire's transaction, after the fired slot's own run started: so that run goes first, and the
make-up runs keep the regular run key, which a late fire of the same slot would collide with.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from celeryapp.domain.cadence import Cadence
from celeryapp.domain.catchup import (
    CatchupPolicy,
    CatchupRules,
    made_up_detail,
    make_up_slots,
    missed_detail,
    policy_of,
)
from celeryapp.domain.effects import Effects
from celeryapp.execution.backfills import create_backfill
from celeryapp.execution.slots import SlotOwner, SlotRow, record_missed, record_slots
from models import Backfill, BackfillOrigin, BackfillStatus, SlotOutcome, SlotRecord, Trigger

#: A made-up slot's record until its catch-up has a number (the same transaction sets it), by
#: whether it is the fired slot, superseded.
_MADE_UP = {superseded: made_up_detail(0, superseded=superseded).removesuffix(" #0") for superseded in (False, True)}
#: Slots one instant apart.
_INSTANT = timedelta(microseconds=1)


def record_unfired(
    session: Session,
    owner: SlotOwner,
    cadence: Cadence,
    catchup: CatchupRules | None,
    between: tuple[datetime | None, datetime],
    trigger: Trigger,
    now: datetime,
    excluded: Callable[[datetime], str | None],
    *,
    superseded: bool,
) -> tuple[datetime, ...]:
    """Record the slots between the last processed one and the one fired that no fire processed;
    the ones the catch-up policy makes up come back (oldest first) for :func:`start_catchup`.
    ``superseded``: the fired slot starts nothing, its fire having come after the next slot was
    due (the workers were down, say), so it may be made up too."""
    since, until = between
    if since is None:
        return ()
    if superseded and policy_of(catchup) is CatchupPolicy.ALL and _catching_up(session, owner.id):
        # A backlog of fire messages (a schedule every few seconds, workers back within the
        # minute the messages live) supersedes one slot after another: one catch-up at a time
        # keeps their make-up runs within max_runs and one at a time.
        superseded = False
    last = until + _INSTANT if superseded else until
    make_up = make_up_slots(cadence, catchup, between=(since, last), now=now, excluded=excluded)
    missed = partial(missed_detail, catchup, now=now)
    # Around the made-up slots, which start_catchup records: the older ones, and the excluded
    # days between them.
    for gap in itertools.pairwise((since, *make_up, until)):
        record_missed(session, owner, cadence, gap, trigger, now, excluded, missed)
    return make_up


def _catching_up(session: Session, schedule_id: int) -> bool:
    running = select(Backfill.id).where(
        Backfill.schedule_id == schedule_id,
        Backfill.origin == BackfillOrigin.CATCHUP,
        Backfill.status == BackfillStatus.RUNNING,
    )
    return session.scalar(running.limit(1)) is not None


def start_catchup(
    session: Session, owner: SlotOwner, slots: tuple[datetime, ...], trigger: Trigger, now: datetime, fired: datetime
) -> Effects:
    """Make the catch-up of ``slots`` and start what may start now; what to send after commit.
    ``fired``: the slot of the fire, made up when it was superseded."""
    if not slots:
        return Effects()
    rows = [
        SlotRow(owner, SlotOutcome.SKIPPED_SUPERSEDED, trigger, slot, None, _MADE_UP[True])
        if slot == fired
        else SlotRow(owner, SlotOutcome.MISSED, trigger, slot, None, _MADE_UP[False])
        for slot in slots
    ]
    # Recorded before the backfill starts its first run, whose own record (fired) follows.
    record_slots(session, rows, now=now)
    start = create_backfill(
        session,
        owner.id,
        list(slots),
        origin=BackfillOrigin.CATCHUP,
        max_concurrent=1,
        now=now,
        reason=f"catchup: all; {len(slots)} missed slots",
    )
    session.execute(
        update(SlotRecord)
        .where(
            SlotRecord.schedule_id == owner.id,
            SlotRecord.recorded_at == now,
            SlotRecord.detail.in_(list(_MADE_UP.values())),
        )
        .values(detail=SlotRecord.detail + f" #{start.backfill_id}")
        .execution_options(synchronize_session=False)
    )
    return start.effects
