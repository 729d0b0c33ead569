"""How chordbeat writes instants and lengths of time: ISO 8601 for machines, one format for people.

The CLI and the dashboard show times the same way (:func:`stamp`). An instant is the schedule's
zone's wall time to the second, its UTC offset and abbreviation (``2026-11-22 02:00:00 +00:00
GMT``), then the viewer's wall time when their zone's offset differs (``07:30 IST here``), then
how far it is from now (``in 5 h 12 min``, ``3 min ago``, ``now``). A length of time names its two largest units
(``0.4 s``, ``5 s``, ``12 s``, ``3 min 4 s``, ``5 h 12 min``, ``2 d 3 h``). Nothing to show (no
time, a length that is not a number) is ``-``. Pure: every instant, ``now`` included, is passed in.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from celeryapp.domain.cron import CronExpression
from celeryapp.domain.dst_rules import DstRules

#: Shown where there is no time or length to show.
NOTHING = "-"


def iso(value: datetime | None, *, timespec: str = "milliseconds") -> str | None:
    """ISO 8601 in UTC with a ``Z``, to the millisecond (the contract's) unless ``timespec`` says
    otherwise (the dashboard shows seconds)."""
    if value is None:
        return None
    if value.tzinfo is not None:
        value = value.astimezone(UTC)
    return value.isoformat(timespec=timespec).replace("+00:00", "Z")


def parse_time(value: str | None) -> datetime | None:
    """An ISO 8601 timestamp of the contract (UTC with a ``Z``); one without a zone is UTC."""
    if not value:
        return None
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def zone_of(name: str | None) -> ZoneInfo:
    """The zone named, for showing times in: UTC when the name is missing or not a zone."""
    try:
        return ZoneInfo(name or "UTC")
    except (ZoneInfoNotFoundError, ValueError):
        return ZoneInfo("UTC")


def span(seconds: float | None) -> str:
    """A length of time for people, its sign dropped: ``0.4 s``, ``5 s``, ``3 min 4 s``, ``2 d 3 h``."""
    if seconds is None or not math.isfinite(seconds):
        return NOTHING
    seconds = abs(seconds)
    if seconds < 10:
        return f"{seconds:.0f} s" if seconds == int(seconds) else f"{seconds:.1f} s"
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{n} {unit}" for n, unit in ((days, "d"), (hours, "h"), (minutes, "min"), (secs, "s")) if n]
    return " ".join(parts[:2])


def relative(moment: datetime | None, now: datetime) -> str:
    """``in 5 h 12 min``, ``3 min ago`` or ``now`` (within a second); whole seconds below a minute."""
    if moment is None:
        return NOTHING
    delta = (moment - now).total_seconds()
    if abs(delta) < 1:
        return "now"
    text = span(delta) if abs(delta) >= 10 else f"{abs(delta):.0f} s"
    return f"in {text}" if delta > 0 else f"{text} ago"


def clock(moment: datetime | None, zone: tzinfo | str) -> str:
    """``2026-11-22 02:00:00 +00:00 GMT``: the zone's wall time, its offset and abbreviation (left
    out where the zone has only a number, as America/Sao_Paulo's ``-03``)."""
    if moment is None:
        return NOTHING
    local = moment.astimezone(zone_of(zone) if isinstance(zone, str) else zone)
    name = local.tzname() or ""
    return f"{local:%Y-%m-%d %H:%M:%S} {_offset(local)}" + (f" {name}" if name[:1].isalpha() else "")


def _offset(local: datetime) -> str:
    offset = local.strftime("%z")
    return f"{offset[:3]}:{offset[3:]}"


def _abbreviation(local: datetime) -> str:
    """The zone's abbreviation (``GMT``, ``IST``), or its offset where it has only a number (``-03``)."""
    name = local.tzname() or ""
    return name if name[:1].isalpha() else _offset(local)


def here(moment: datetime | None, zone: tzinfo | str, viewer: tzinfo | str | None) -> str:
    """The viewer's wall time (``07:30 IST here``, with the date when it is another day there), or
    ``""`` when the viewer's offset is the zone's at that instant (the same wall time)."""
    if moment is None or viewer is None:
        return ""
    local = moment.astimezone(zone_of(zone) if isinstance(zone, str) else zone)
    theirs = moment.astimezone(zone_of(viewer) if isinstance(viewer, str) else viewer)
    if theirs.utcoffset() == local.utcoffset():
        return ""
    day = f"{theirs:%Y-%m-%d} " if theirs.date() != local.date() else ""
    return f"{day}{theirs:%H:%M} {_abbreviation(theirs)} here"


def stamp(moment: str | datetime | None, zone: tzinfo | str, viewer: tzinfo | str | None, now: datetime) -> str:
    """An instant as people see it everywhere: ``2026-11-22 02:00:00 +00:00 GMT, 07:30 IST here, 3 min
    ago``: the schedule's zone with its offset, the viewer's zone beside it when its offset differs
    (none given: left out), how far from now; ``-`` if there is none. Never ISO's ``T…Z``.

    ``now`` is the reference clock's (``models.utcnow``): a host clock that is off would make every
    "3 min ago" wrong by as much."""
    instant = parse_time(moment) if isinstance(moment, str) or moment is None else moment
    if instant is None:
        return NOTHING
    parts = [clock(instant, zone), here(instant, zone, viewer), relative(instant, now)]
    return ", ".join(part for part in parts if part)


def when(value: str | datetime | None, zone: tzinfo | str, now: datetime) -> str:
    """:func:`stamp` without a viewer's zone: the schedule's zone and how far from now."""
    return stamp(value, zone, None, now)


def took(started: str | datetime | None, completed: str | datetime | None, now: datetime) -> str:
    """How long a run or step took; still running: how long so far (``12 s so far``); ``-`` if it
    has not started. A clock that went back shows as no time, not as a negative one."""
    start = parse_time(started) if isinstance(started, str) or started is None else started
    if start is None:
        return NOTHING
    end = parse_time(completed) if isinstance(completed, str) or completed is None else completed
    length = span(max(timedelta(0), (end or now) - start).total_seconds())
    return length if end is not None else f"{length} so far"


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


#: An instant as the contract writes it (``2026-11-24T14:33:00.000Z``), inside a text beat wrote:
#: a retry's reason, a slot record's summary.
ISO_INSTANT = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")


def instants_in(text: str, zone: tzinfo | str) -> str:
    """``text`` with the ISO instants in it written as people's times (:func:`clock`) in ``zone``."""
    return ISO_INSTANT.sub(lambda m: clock(parse_time(m.group()), zone), text)
