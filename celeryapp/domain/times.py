"""How chordbeat writes instants and lengths of time: ISO 8601 for machines, one format for people.

The CLI and the dashboard show times the same way. An instant is the zone's wall time to the
second, its UTC offset and abbreviation (``2026-11-22 02:00:00 +00:00 GMT``), then how far it is
from now (``in 5 h 12 min``, ``3 min ago``, ``now``). A length of time names its two largest units
(``0.4 s``, ``5 s``, ``12 s``, ``3 min 4 s``, ``5 h 12 min``, ``2 d 3 h``). Nothing to show (no
time, a length that is not a number) is ``-``. Pure: every instant, ``now`` included, is passed in.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from celeryapp.domain.cron import CronExpression

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


def clock(moment: datetime | None, zone: ZoneInfo | str) -> str:
    """``2026-11-22 02:00:00 +00:00 GMT``: the zone's wall time, its offset and abbreviation."""
    if moment is None:
        return NOTHING
    local = moment.astimezone(zone_of(zone) if isinstance(zone, str) else zone)
    offset = local.strftime("%z")
    return f"{local:%Y-%m-%d %H:%M:%S} {offset[:3]}:{offset[3:]} {local.tzname()}"


def when(value: str | datetime | None, zone: ZoneInfo | str, now: datetime) -> str:
    """A time as shown everywhere: :func:`clock`, then :func:`relative`; ``-`` if there is none.

    ``now`` is the reference clock's (``models.utcnow``): a host clock that is off would make every
    "3 min ago" wrong by as much."""
    moment = parse_time(value) if isinstance(value, str) or value is None else value
    if moment is None:
        return NOTHING
    return f"{clock(moment, zone)}, {relative(moment, now)}"


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
    first: datetime | None, *, cron: str | None, every_s: float | None, zone: ZoneInfo, count: int
) -> list[datetime]:
    """``count`` fire times of a cadence from ``first`` (its next run) on, in ``zone``; none
    without a next run."""
    if first is None or count < 1:
        return []
    if cron:
        times = [first, *CronExpression.parse(cron).upcoming(first, zone, count - 1)]
    elif every_s is not None:
        times = [first + timedelta(seconds=every_s * i) for i in range(count)]
    else:
        times = [first]  # a definition always has one of the two; without either, only what is known
    return [t.astimezone(zone) for t in times[:count]]
