"""When a schedule is due: nominal slots of cron and interval schedules, and retries.

Pure: the caller passes every instant in. Interval slots are anchored (anchor + k·every), so they
never drift and every beat process computes the same slot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from celeryapp.cron import CronExpression

#: Bound on slots walked to find the latest missed one after downtime (then the walk jumps).
MAX_SLOT_WALK = 10_000


@dataclass(frozen=True)
class Cadence:
    cron: str | None
    every_s: float | None
    timezone: str
    #: Interval schedules count their slots from here (the time the definition last changed).
    anchor: datetime

    def slot_after(self, t: datetime) -> datetime:
        """The first nominal slot strictly after ``t``."""
        if self.cron is not None:
            return CronExpression.parse(self.cron).next_after(t, ZoneInfo(self.timezone))
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
            slot = self.anchor + step * k
            return slot if slot > since and slot <= now else None
        slot = self.slot_after(since)
        if slot > now:
            return None
        for _ in range(MAX_SLOT_WALK):
            following = self.slot_after(slot)
            if following > now:
                return slot
            slot = following
        # A very long outage of a very frequent schedule: restart the walk close to now.
        return self.latest_slot(now, since=max(slot, now - timedelta(days=1)))


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
