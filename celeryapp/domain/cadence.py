"""When a schedule is due: nominal slots of cron and interval schedules, and retries.

Pure: the caller passes every instant in. Interval slots are anchored (anchor + k·every), so they
never drift and every beat process computes the same slot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from celeryapp.domain.cron import CronExpression
from celeryapp.domain.dst_rules import DstRules

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
