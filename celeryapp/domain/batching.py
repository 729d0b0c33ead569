"""Which slots of a beat tick's batch may be fired together, and why the others go alone.

Together, a slot shares one transaction and a few statements with the others: that is only
right for a fire that claims its slot and starts a run, and writes nothing else. Anything more
(a retry, a skip to record, missed slots, an overlap to apply) is what a fire alone knows how to
do, so such a slot is fired alone, with exactly the outcome it would have had anyway.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import NamedTuple

from celeryapp.domain.cadence import Cadence
from celeryapp.domain.decisions import ScheduleState, decide_fire
from celeryapp.states import Overlap, Trigger


class Fire(NamedTuple):
    """One slot of a batch fire message."""

    name: str
    nominal_at: datetime
    trigger: Trigger


@dataclass(frozen=True)
class BatchSchedule:
    """A schedule a batch fires, as read under its row lock."""

    state: ScheduleState
    cadence: Cadence
    overlap: Overlap
    #: It has a business calendar: whether the slot runs is the fire alone's to decide (it reads
    #: the calendar's files).
    has_calendar: bool = False
    #: Seconds after its nominal time a slot may fire and still run (``catchup: none``); a later
    #: one is the fire alone's to record missed. ``None``: any delay runs.
    late_after_s: float | None = None


class Alone(StrEnum):
    """Why a slot is fired alone."""

    #: A retry replaces the regular slots due meanwhile, which only a fire alone works out.
    RETRY = "retry"
    #: A second slot of one schedule waits for the first one's outcome.
    REPEATED = "repeated"
    #: No such schedule: the fire alone answers it and removes its beat entry.
    UNKNOWN = "unknown"
    #: The fire starts no run, or records more than its run (a pause, a supersede, a duplicate,
    #: a pending retry).
    NO_PLAIN_START = "no plain start"
    #: Slots before it were never fired: the fire alone records them as missed.
    MISSED = "missed"
    #: Its exclusive schedule has a run in progress: the fire alone applies the overlap policy.
    BUSY = "busy"
    #: Its schedule has a business calendar, which may exclude the slot's day.
    CALENDAR = "calendar"
    #: It fired too late for its schedule's ``catchup: none``: the fire alone records it missed.
    LATE = "late"


@dataclass(frozen=True)
class BatchPlan:
    """The slots (by their index in the batch) that start their run together, and the others."""

    #: In the order of the schedules given (their lock order).
    together: tuple[int, ...]
    alone: Mapping[int, Alone]
    #: Of ``together``, the slots of schedules that are not ``overlap: allow``: they stay together
    #: only if their schedule has no run in progress (see :meth:`without_busy`).
    exclusive: tuple[int, ...] = ()

    def without_busy(self, busy: Collection[int]) -> BatchPlan:
        """The plan once the ``exclusive`` slots whose schedule has a run in progress (``busy``,
        by index) go alone."""
        moved = {index for index in self.exclusive if index in busy}
        return BatchPlan(
            tuple(index for index in self.together if index not in moved),
            {**self.alone, **dict.fromkeys(moved, Alone.BUSY)},
            tuple(index for index in self.exclusive if index not in moved),
        )


def decide_batchable(fires: Sequence[Fire], schedules: Mapping[str, BatchSchedule], *, now: datetime) -> BatchPlan:
    """Which of ``fires`` start their run together; ``schedules``: those of their names that
    exist, in the order their rows were locked."""
    alone: dict[int, Alone] = {}
    first: dict[str, int] = {}
    for index, slot in enumerate(fires):
        if slot.trigger is Trigger.RETRY:
            alone[index] = Alone.RETRY
        elif slot.name in first:
            alone[index] = Alone.REPEATED
        else:
            first[slot.name] = index
    alone.update((index, Alone.UNKNOWN) for name, index in first.items() if name not in schedules)
    together: list[int] = []
    exclusive: list[int] = []
    for name, schedule in schedules.items():
        if name not in first:
            continue
        index = first[name]
        slot, state = fires[index], schedule.state
        decision = decide_fire(
            state, trigger=slot.trigger, nominal_at=slot.nominal_at, now=now, cadence=schedule.cadence
        )
        if not (decision.start and decision.claims_slot):
            alone[index] = Alone.NO_PLAIN_START
        elif state.last_slot_at is not None and schedule.cadence.slot_after(state.last_slot_at) < slot.nominal_at:
            alone[index] = Alone.MISSED
        elif schedule.has_calendar:
            alone[index] = Alone.CALENDAR
        elif schedule.late_after_s is not None and (now - slot.nominal_at).total_seconds() > schedule.late_after_s:
            alone[index] = Alone.LATE
        else:
            together.append(index)
            if schedule.overlap is not Overlap.ALLOW:
                exclusive.append(index)
    return BatchPlan(tuple(together), alone, tuple(exclusive))
