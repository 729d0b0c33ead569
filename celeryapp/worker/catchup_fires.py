"""A fire's catch-up: the slots before it that no fire processed, recorded, and for a
``catchup: all`` schedule the newest of them run again, oldest first, one at a time.

The make-up runs are a backfill of origin ``catchup`` (celeryapp/execution/backfills.py) made in
the fire's transaction, after the fired slot's own run started: so that run goes first, and the
make-up runs keep the regular run key, which a late fire of the same slot would collide with.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import datetime
from functools import partial

from sqlalchemy import update
from sqlalchemy.orm import Session

from celeryapp.domain.cadence import Cadence
from celeryapp.domain.catchup import CatchupRules, made_up_detail, make_up_slots, missed_detail
from celeryapp.domain.effects import Effects
from celeryapp.execution.backfills import create_backfill
from celeryapp.execution.slot_records import SlotOwner, SlotRow, record_slots
from celeryapp.worker.slot_claims import record_missed
from models import BackfillOrigin, SlotOutcome, SlotRecord, Trigger

#: A made-up slot's record until its catch-up has a number (the same transaction sets it).
_MADE_UP = "missed; made up by catch-up"


def record_unfired(
    session: Session,
    owner: SlotOwner,
    cadence: Cadence,
    catchup: CatchupRules | None,
    between: tuple[datetime | None, datetime],
    trigger: Trigger,
    now: datetime,
    excluded: Callable[[datetime], str | None],
) -> tuple[datetime, ...]:
    """Record the slots between the last processed one and the one fired that no fire processed;
    the ones the catch-up policy makes up come back (oldest first) for :func:`start_catchup`."""
    since, until = between
    if since is None:
        return ()
    make_up = make_up_slots(cadence, catchup, between=(since, until), now=now, excluded=excluded)
    missed = partial(missed_detail, catchup, now=now)
    # Around the made-up slots, which start_catchup records: the older ones, and the excluded
    # days between them.
    for gap in itertools.pairwise((since, *make_up, until)):
        record_missed(session, owner, cadence, gap, trigger, now, excluded, missed)
    return make_up


def start_catchup(
    session: Session, owner: SlotOwner, slots: tuple[datetime, ...], trigger: Trigger, now: datetime
) -> Effects:
    """Make the catch-up of ``slots`` and start what may start now; what to send after commit."""
    if not slots:
        return Effects()
    # Recorded before the backfill starts its first run, whose own record (fired) follows.
    record_slots(
        session, [SlotRow(owner, SlotOutcome.MISSED, trigger, slot, None, _MADE_UP) for slot in slots], now=now
    )
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
            SlotRecord.detail == _MADE_UP,
        )
        .values(detail=made_up_detail(start.backfill_id))
        .execution_options(synchronize_session=False)
    )
    return start.effects
