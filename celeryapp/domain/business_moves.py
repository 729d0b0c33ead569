"""Where ``on_excluded: next_business_day`` moves a slot's run: its wall time on the next business
day (Monday to Friday, not excluded), as an instant by the schedule's DST rule.

Every excluded slot keeps a run of its own there, even when the cron fires on that day too (two
runs at that time: the day's own and the moved one, whose ``slot`` is the excluded slot's): the
fire makes it a one-slot backfill that waits (:mod:`celeryapp.worker.moved_fires`).

Pure: the caller passes the calendar (:class:`celeryapp.domain.calendars.Calendar`).
"""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

from celeryapp.domain.calendars import Calendar
from celeryapp.domain.calendars import next_business_day as business_day_after
from celeryapp.domain.cron import instant_of
from celeryapp.domain.dst_rules import DEFAULT, DstRules, Repeated


def wall_instant(naive: datetime, zone: ZoneInfo, dst: DstRules | None) -> datetime | None:
    """The instant of a wall time by the DST rule: a repeated one's first pass (its second with
    ``repeated: last``; ``both`` runs a moved slot once, in the first), a missing one the change
    (``None`` with ``missing: skip``: the moved run is skipped too)."""
    rules = dst or DEFAULT
    return instant_of(naive, zone, 1 if rules.repeated is Repeated.LAST else 0, rules.skips_missing)


def moved_to(slot: datetime, zone: ZoneInfo, calendar: Calendar, dst: DstRules | None) -> datetime | None:
    """Where the run of ``slot`` (on an excluded day) moves: its wall time on the next business day.
    ``None`` when that wall time does not exist there and the rule skips it;
    :class:`~celeryapp.domain.calendars.CalendarError` when no business day comes within
    :data:`~celeryapp.domain.calendars.MAX_BUSINESS_DAY_SEARCH_DAYS`."""
    wall = slot.astimezone(zone)
    target = business_day_after(wall.date(), calendar)
    return wall_instant(datetime.combine(target, wall.time().replace(tzinfo=None)), zone, dst)
