"""Where ``on_excluded: next_business_day`` moves a slot's run, and which slots a run was moved from.

A slot on a day the schedule's calendar excludes runs at the same wall time on the next business
day (Monday to Friday, not excluded): a cron's times are the same every day it fires, so when it
fires on that day too the moved run is that day's own slot (one run, not two); otherwise it is a
slot of its own. The instant is the wall time's by the schedule's DST rule. Both directions are
given here: :func:`moved_to` for the excluded slot's record ("moved to ..."), :func:`moved_from`
for the run's ("moved from ..."), and :func:`extra_slots` for the moved runs beat must fire
besides the cron's own slots.

Pure: the caller passes the calendar (:class:`celeryapp.domain.calendars.Calendar`).
"""

from __future__ import annotations

from datetime import datetime, time, timedelta
from zoneinfo import ZoneInfo

from celeryapp.domain.calendars import MAX_BUSINESS_DAY_SEARCH_DAYS, WEEKEND, Calendar, CalendarError
from celeryapp.domain.calendars import next_business_day as business_day_after
from celeryapp.domain.cron import CronExpression, instant_of
from celeryapp.domain.dst_rules import DEFAULT, DstRules, Repeated


def wall_instant(naive: datetime, zone: ZoneInfo, dst: DstRules | None) -> datetime | None:
    """The instant of a wall time by the DST rule: a repeated one's first pass (its second with
    ``repeated: last``; ``both`` runs a moved slot once, in the first), a missing one the change
    (``None`` with ``missing: skip``: the moved run is skipped too)."""
    rules = dst or DEFAULT
    return instant_of(naive, zone, 1 if rules.repeated is Repeated.LAST else 0, rules.skips_missing)


def moved_to(slot: datetime, zone: ZoneInfo, calendar: Calendar, dst: DstRules | None) -> datetime | None:
    """Where the run of ``slot`` (on an excluded day) moves: its wall time on the next business day.
    ``None`` when that wall time does not exist there and the rule skips it; :class:`CalendarError`
    when no business day comes within :data:`MAX_BUSINESS_DAY_SEARCH_DAYS`."""
    wall = slot.astimezone(zone)
    target = business_day_after(wall.date(), calendar)
    return wall_instant(datetime.combine(target, wall.time().replace(tzinfo=None)), zone, dst)


def moved_from(
    slot: datetime, zone: ZoneInfo, calendar: Calendar, cron: CronExpression, dst: DstRules | None
) -> list[datetime]:
    """The excluded slots whose runs move to ``slot`` (oldest first): those at ``slot``'s wall time
    on each day the cron fires between the previous business day and ``slot``'s day, every one of
    them excluded or a weekend (the days a next business day passes over)."""
    wall = slot.astimezone(zone)
    if wall.weekday() in WEEKEND or wall.date() in calendar.reasons:
        return []  # not a business day: nothing moves here
    found: list[datetime] = []
    day = wall.date()
    for _ in range(MAX_BUSINESS_DAY_SEARCH_DAYS):
        try:
            day -= timedelta(days=1)
        except OverflowError:
            break
        if day.weekday() not in WEEKEND and day not in calendar.reasons:
            break  # a business day: the days before it move to it, not here
        if day in calendar.reasons and cron.fires_on(day):
            earlier = wall_instant(datetime.combine(day, wall.time().replace(tzinfo=None)), zone, dst)
            if earlier is not None and moved_to(earlier, zone, calendar, dst) == slot:
                found.append(earlier)
    return sorted(found)


def extra_slots(
    cron: CronExpression, zone: ZoneInfo, calendar: Calendar, dst: DstRules | None, since: datetime, until: datetime
) -> list[datetime]:
    """The moved runs in (since, until] that are no slot of the cron (their day is one it does not
    fire on), oldest first: beat fires them besides the cron's own. Each excluded day the cron fires
    on is looked at from ``MAX_BUSINESS_DAY_SEARCH_DAYS`` before ``since``."""
    extra: set[datetime] = set()
    start = since.astimezone(zone).date() - timedelta(days=MAX_BUSINESS_DAY_SEARCH_DAYS)
    end = until.astimezone(zone).date()
    for day in sorted(d for d in calendar.reasons if start <= d <= end and cron.fires_on(d)):
        try:
            target = business_day_after(day, calendar)
        except CalendarError:
            continue  # never moves: the fire records it skipped
        if cron.fires_on(target):
            continue  # the target day's own slots are the moved runs
        for naive in cron.wall_times(datetime.combine(day, time()), datetime.combine(target, time())):
            if naive.date() != day:
                break
            moved = wall_instant(datetime.combine(target, naive.time()), zone, dst)
            if moved is not None and since < moved <= until:
                extra.add(moved)
    return sorted(extra)
