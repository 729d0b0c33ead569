"""A slot its business calendar moves (``calendar.on_excluded: next_business_day``): its run is a
one-slot backfill of origin ``moved`` that waits until the slot's wall time on the next business
day (``not_before``), made in the fire's transaction.

The backfill driver starts it once that time has come: at recovery's next pass (every
``CHORDBEAT_RECOVERY_INTERVAL``), or earlier at any run end or fire of the schedule that drives its
backfills. The run keeps the schedule's regular trigger, its ``slot`` is the excluded slot (so
``current_step().slot`` says which day it covers) and its run key ``{name}:moved:{slot}`` makes a
doubled fire one run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from functools import partial
from typing import Any

from sqlalchemy.orm import Session

from celeryapp.domain.decisions import FireDecision
from celeryapp.domain.dst_rules import DstRules
from celeryapp.domain.effects import Effects
from celeryapp.domain.times import iso
from celeryapp.execution.backfills import create_backfill
from celeryapp.execution.slots import SlotOwner
from celeryapp.scheduling.calendar_files import moved_slot, moves_slots
from models import BackfillOrigin

logger = logging.getLogger(__name__)


def mover(
    directory: str | None, calendar: Any, timezone: str, dst: DstRules | None, slot: datetime
) -> Callable[[], datetime | str] | None:
    """What says where the stored ``calendar`` moves the run of ``slot`` (for
    :func:`celeryapp.domain.decisions.decide_calendar`); ``None`` when it skips excluded slots."""
    return partial(moved_slot, directory, calendar, timezone, dst, slot) if moves_slots(calendar) else None


def start_moved(session: Session, owner: SlotOwner, decision: FireDecision, slot: datetime, now: datetime) -> Effects:
    """For a slot ``decision`` moved, make the waiting backfill of its run; what to send after
    commit (nothing, unless the time moved to has passed: a fire late by a day)."""
    if decision.moved_to is None or decision.reason is None:
        return Effects()
    # The calendar's reason, which the run's own slot record repeats ("moved from ...: reason").
    why = decision.reason.removeprefix(f"moved to {iso(decision.moved_to)}: ")
    start = create_backfill(
        session,
        owner.id,
        [slot],
        origin=BackfillOrigin.MOVED,
        max_concurrent=1,
        now=now,
        reason=why,
        mode="moved",
        not_before=decision.moved_to,
    )
    logger.info(
        "schedule %r: the slot at %s moved to %s (backfill #%s)",
        owner.name,
        iso(slot),
        iso(decision.moved_to),
        start.backfill_id,
    )
    return start.effects
