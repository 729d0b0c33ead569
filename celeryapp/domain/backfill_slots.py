"""Which past slots a backfill runs, and the names of its runs. Pure: the caller reads the
schedule's runs and passes what it found in.

A backfill's slots are decided once, when it is made, oldest first; a slot already queued in a
running backfill or with a run in progress is never listed again, whatever the mode.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any
from zoneinfo import ZoneInfo

from celeryapp.domain.cadence import Cadence
from celeryapp.domain.limits import short_repr, type_name
from celeryapp.domain.times import iso
from celeryapp.errors import InvalidArgument

#: At most this many slots in one backfill: a reversed or huge range is refused, not queued.
MAX_BACKFILL_SLOTS = 10_000
#: ``max_concurrent`` is 1 to this many runs of one backfill at a time.
MAX_CONCURRENT_RUNS = 100
#: Characters of an ISO 8601 time argument at most (a longer string is no time).
MAX_TIME_CHARS = 40
#: Slots are ``start ≤ slot < end``; the cadence's walk is ``(since, until]``: shifted by this.
_TICK = timedelta(microseconds=1)
#: A time must lie this far after datetime's first instant: a day covers any zone's offset.
_EDGE = timedelta(days=2)


class BackfillMode(StrEnum):
    """Which slots of the range a backfill runs."""

    #: Slots with no run (never fired, recorded missed or skipped).
    MISSING = "missing"
    #: Slots whose latest run failed or was cancelled.
    FAILED = "failed"
    #: Every slot of the range.
    ALL = "all"


def time_arg(field: str, value: Any) -> datetime:
    """An aware time from an ISO 8601 string with its UTC offset; refused naming ``field``."""
    if not isinstance(value, str) or len(value) > MAX_TIME_CHARS:
        got = type_name(value) if not isinstance(value, str) else f"{len(value)} characters"
        raise InvalidArgument(field, f"must be an ISO 8601 time with its UTC offset, got {got}")
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidArgument(field, f"is not a time that exists (ISO 8601), got {short_repr(value)}") from None
    if when.tzinfo is None:
        raise InvalidArgument(field, f"must say its UTC offset (e.g. 2026-01-01T00:00:00Z), got {short_repr(value)}")
    try:
        # The range walk steps back a tick and into the schedule's zone: at the edge of year 1
        # that is year 0 (and year 9999 west of UTC is 10000 in UTC): an OverflowError, a 500 on
        # the dashboard, rather than a refusal.
        when.astimezone(UTC) - _EDGE
    except OverflowError:
        raise InvalidArgument(field, f"is out of range (too near year 1 or 9999), got {short_repr(value)}") from None
    return when


def parse_mode(value: Any) -> BackfillMode:
    choices = ", ".join(m.value for m in BackfillMode)
    if not isinstance(value, str) or value not in {m.value for m in BackfillMode}:
        raise InvalidArgument("mode", f"must be one of {choices}, got {short_repr(value)}")
    return BackfillMode(value)


def parse_max_concurrent(value: Any) -> int:
    # bool is an int to Python; a float (NaN, 2.0) or a string is refused as well.
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CONCURRENT_RUNS:
        got = short_repr(value) if not isinstance(value, float) or math.isfinite(value) else str(value)
        raise InvalidArgument("max_concurrent", f"must be a whole number from 1 to {MAX_CONCURRENT_RUNS}, got {got}")
    return value


def check_range(start: datetime, end: datetime, *, now: datetime) -> None:
    """A range of past slots: ``start < end ≤ now``."""
    if end <= start:
        what = "is the same as" if end == start else "is before"
        raise InvalidArgument("end", f"{iso(end)} {what} start {iso(start)}; slots are start ≤ slot < end")
    if end > now:
        raise InvalidArgument("end", f"{iso(end)} is in the future (now {iso(now)}); a backfill runs past slots")


def range_slots(cadence: Cadence, start: datetime, end: datetime, cap: int = MAX_BACKFILL_SLOTS) -> list[datetime]:
    """The schedule's slots with ``start ≤ slot < end``, oldest first; more than ``cap`` is refused
    (only ``cap + 1`` slots are walked, however long the range)."""
    slots, more = cadence.slots_between(start - _TICK, end - _TICK, cap)
    if more:
        raise InvalidArgument(
            "end", f"the range holds more than {cap} slots (found {cap + 1} before its end); backfill it in parts"
        )
    return slots


@dataclass(frozen=True)
class BackfillBounds:
    """What running backfills may hold not started yet (CHORDBEAT_BACKFILL_MAX_*)."""

    pending_per_schedule: int
    pending: int
    step_runs: int


@dataclass(frozen=True)
class Backlog:
    """What the running backfills hold not started yet, before the request."""

    schedule_pending: int
    pending: int
    steps_per_run: int


def check_bounds(name: str, count: int, backlog: Backlog, bounds: BackfillBounds) -> None:
    """Refuse (naming ``end``: a shorter range asks less) a request of ``count`` slots that would
    take the schedule's or the deployment's slots not started, or the step executions the
    schedule's backfills may still queue, past their bound."""
    schedule_pending = backlog.schedule_pending + count
    if schedule_pending > bounds.pending_per_schedule:
        raise InvalidArgument(
            "end",
            f"{count} slots would leave {schedule_pending} not started in {name!r}'s backfills, more than "
            f"{bounds.pending_per_schedule} (CHORDBEAT_BACKFILL_MAX_PENDING_PER_SCHEDULE); "
            "wait for them or cancel one",
        )
    pending = backlog.pending + count
    if pending > bounds.pending:
        raise InvalidArgument(
            "end",
            f"{count} slots would leave {pending} not started in the deployment's backfills, more than "
            f"{bounds.pending} (CHORDBEAT_BACKFILL_MAX_PENDING); wait for them or cancel one",
        )
    step_runs = schedule_pending * backlog.steps_per_run
    if step_runs > bounds.step_runs:
        raise InvalidArgument(
            "end",
            f"{schedule_pending} slots of {backlog.steps_per_run} steps would queue {step_runs} step executions "
            f"in {name!r}'s backfills, more than {bounds.step_runs} (CHORDBEAT_BACKFILL_MAX_STEP_RUNS); "
            "backfill it in parts",
        )


def choose_slots(
    slots: Iterable[datetime],
    mode: BackfillMode,
    *,
    ran: Collection[datetime],
    latest_failed: Collection[datetime],
    busy: Collection[datetime],
) -> list[datetime]:
    """The slots the backfill runs, in the order given (oldest first).

    ``ran``: slots with any run; ``latest_failed``: those whose latest run failed or was
    cancelled; ``busy``: those with a run in progress or queued in a running backfill.
    """
    chosen = []
    for slot in slots:
        if slot in busy:
            continue
        if mode is BackfillMode.MISSING and slot in ran:
            continue
        if mode is BackfillMode.FAILED and slot not in latest_failed:
            continue
        chosen.append(slot)
    return chosen


def why_no_slots(
    cadence: Cadence, mode: BackfillMode, start: datetime, end: datetime, *, in_range: int, chosen: int
) -> str:
    """Why a backfill request found nothing to run, with the range as it was understood (in the
    schedule's zone): no slot in it, every one taken away by the mode, or by the calendar."""
    zone = ZoneInfo(cadence.timezone)
    shown = f"{start.astimezone(zone).isoformat()} to {end.astimezone(zone).isoformat()} ({cadence.timezone} time)"
    if not in_range:
        if cadence.every_s is not None and end <= cadence.anchor:
            return (
                f"no slot from {shown}: an interval schedule's slots begin when its definition was last "
                f"applied, {cadence.anchor.astimezone(zone).isoformat()}, after that range"
            )
        return f"no slot of the schedule falls from {shown}"
    slots = f"{in_range} slot{'' if in_range == 1 else 's'} from {shown}"
    if not chosen:
        if mode is BackfillMode.MISSING:
            return f"the {slots} already have a run or one in progress (mode missing; mode all runs them again)"
        if mode is BackfillMode.FAILED:
            return f"no last run of the {slots} failed or was cancelled (mode failed)"
        return f"the {slots} each have a run in progress or waiting in a backfill"
    return f"the schedule's calendar excludes the {slots}"


def backfill_run_key(name: str, slot: datetime, *, earlier_backfill_runs: int, mode: str) -> str:
    """The run key of a backfill's run of ``slot`` that ran before (modes ``all`` and ``failed``;
    mode ``missing`` runs a slot under its regular key).

    The first backfill run of a slot has the plain key, so a request made twice starts it once;
    mode ``failed`` runs a slot again on purpose: its key counts the backfill runs before it,
    which the database says (a doubled request still collides).
    """
    key = f"{name}:backfill:{iso(slot)}"
    if mode == BackfillMode.FAILED and earlier_backfill_runs:
        return f"{key}:{earlier_backfill_runs + 1}"
    return key


def request_key(name: str, start: datetime, end: datetime, mode: BackfillMode) -> str:
    """Names a request: the same one while it runs answers with the running backfill."""
    return f"{name}:{iso(start)}:{iso(end)}:{mode.value}"
