"""When a schedule is due: nominal slots of cron and interval schedules, its next fire times, and
retries.

Pure: the caller passes every instant in. Interval slots are anchored (anchor + k·every), so they
never drift and every beat process computes the same slot. Beat, a fire, recovery, the alerts'
watch, the service and the dashboard all take a schedule's cadence from :func:`cadence_of`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol
from zoneinfo import ZoneInfo

from celeryapp.domain.cron import CronExpression
from celeryapp.domain.dst_rules import DstRules
from celeryapp.states import ScheduleStatus

#: Retry delays never grow past this many times the base delay.
BACKOFF_CAP_FACTOR = 10
#: First look-back window when searching the latest missed cron slot.
LOOKBACK_START = timedelta(hours=1)


@dataclass(frozen=True)
class Cadence:
    cron: str | None
    every_s: float | None
    timezone: str
    #: Interval schedules count their slots from here (the time the definition last changed).
    anchor: datetime
    #: The schedule's own DST rule (cron only); ``None``: the default one.
    dst: DstRules | None = None

    def slot_after(self, t: datetime) -> datetime:
        """The first nominal slot strictly after ``t``."""
        if self.cron is not None:
            return CronExpression.parse(self.cron).next_after(t, ZoneInfo(self.timezone), self.dst)
        assert self.every_s is not None
        step = timedelta(seconds=self.every_s)
        if t < self.anchor:
            return self.anchor
        k = math.floor((t - self.anchor) / step) + 1
        return self.anchor + step * k

    def latest_slot(self, now: datetime, *, since: datetime) -> datetime | None:
        """The last nominal slot in (since, now], or ``None`` if no slot fell in it.

        After downtime this is the one slot that runs: no make-up runs for the earlier ones.
        """
        if self.cron is None:
            assert self.every_s is not None
            step = timedelta(seconds=self.every_s)
            k = math.floor((now - self.anchor) / step)
            latest = self.anchor + step * k
            return latest if since < latest <= now else None
        # Look back over a growing window rather than walking every missed slot from ``since``:
        # a minutely schedule after a month of downtime would otherwise walk 43,200 slots.
        window = LOOKBACK_START
        while True:
            start = max(since, now - window)
            found = self._last_in(start, now)
            if found is not None or start == since:
                return found
            window *= 4

    def slots_between(self, since: datetime, until: datetime, cap: int) -> tuple[list[datetime], bool]:
        """The first ``cap`` nominal slots in (since, until], oldest first, and whether more slots
        fell in it after them (each slot is found from the one before: only ``cap + 1`` are)."""
        if cap < 1:
            raise ValueError("cap must be at least 1")
        slots: list[datetime] = []
        slot = self.slot_after(since)
        while slot <= until:
            if len(slots) == cap:
                return slots, True
            slots.append(slot)
            slot = self.slot_after(slot)
        return slots, False

    def _last_in(self, start: datetime, end: datetime) -> datetime | None:
        found = None
        slot = self.slot_after(start)
        while slot <= end:
            found = slot
            slot = self.slot_after(slot)
        return found


class CadenceFields(Protocol):
    """What a schedule's cadence is made of: a schedule row, or the few columns beat reads of it."""

    @property
    def cron(self) -> str | None: ...
    @property
    def every_s(self) -> float | None: ...
    @property
    def timezone(self) -> str: ...
    #: When its definition last changed: interval slots count from there.
    @property
    def updated_at(self) -> datetime: ...
    #: The stored ``dst`` object (None: the default DST rule).
    @property
    def dst(self) -> dict[str, Any] | None: ...


def cadence_of(schedule: CadenceFields) -> Cadence:
    return Cadence(
        cron=schedule.cron,
        every_s=schedule.every_s,
        timezone=schedule.timezone,
        anchor=schedule.updated_at,
        dst=DstRules.from_json(schedule.dst),
    )


class FireFields(CadenceFields, Protocol):
    """A schedule's cadence and where it stands: what its next fire times are computed from."""

    @property
    def status(self) -> ScheduleStatus: ...
    @property
    def retry_at(self) -> datetime | None: ...
    @property
    def next_run_at(self) -> datetime | None: ...


def next_fire_times(schedule: FireFields, now: datetime, count: int) -> list[datetime]:
    """The next ``count`` fire times in the schedule's zone (a paused schedule: when it would fire
    if resumed; a done or dead one has none)."""
    if schedule.status in {ScheduleStatus.DONE, ScheduleStatus.DEAD}:
        return []
    first = schedule.retry_at or schedule.next_run_at or cadence_of(schedule).slot_after(now)
    zone = ZoneInfo(schedule.timezone)
    dst = DstRules.from_json(schedule.dst)
    return fire_times(first, cron=schedule.cron, every_s=schedule.every_s, zone=zone, count=count, dst=dst)


def fire_times(
    first: datetime | None,
    *,
    cron: str | None,
    every_s: float | None,
    zone: ZoneInfo,
    count: int,
    dst: DstRules | None = None,
) -> list[datetime]:
    """``count`` fire times of a cadence from ``first`` (its next run) on, in ``zone`` (a cron's
    by its ``dst`` rule); none without a next run."""
    if first is None or count < 1:
        return []
    if cron:
        times = [first, *CronExpression.parse(cron).upcoming(first, zone, count - 1, dst)]
    elif every_s is not None:
        times = [first + timedelta(seconds=every_s * i) for i in range(count)]
    else:
        times = [first]  # a definition always has one of the two; without either, only what is known
    return [t.astimezone(zone) for t in times[:count]]


@dataclass(frozen=True)
class Due:
    """What a beat entry fires next."""

    at: datetime
    #: True when it is a retry of a failed execution rather than a regular slot.
    retry: bool


def next_due(cadence: Cadence, *, last_fired: datetime, retry_at: datetime | None) -> Due:
    """While a retry is pending it replaces the regular cadence."""
    if retry_at is not None and retry_at > last_fired:
        return Due(retry_at, retry=True)
    return Due(cadence.slot_after(last_fired), retry=False)


def retry_delay_s(base_s: float, retry: int) -> float:
    """Delay before retry number ``retry`` (1-based): min(base·2^(retry-1), base·10)."""
    if retry < 1:
        raise ValueError("retry numbers start at 1")
    return float(min(base_s * 2 ** (retry - 1), base_s * BACKOFF_CAP_FACTOR))
