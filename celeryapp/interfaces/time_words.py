"""Times in people's words, as the CLI and the dashboard show them: instants, lengths, and a
schedule's time control.

An instant (:func:`stamp`) is the schedule's zone's wall time to the second, its UTC offset and
abbreviation (``2026-11-22 02:00:00 +00:00 GMT``), then the viewer's wall time when their zone's
offset differs (``07:30 IST here``), then how far it is from now (``in 5 h 12 min``, ``3 min ago``,
``now``). A length of time is :func:`celeryapp.domain.times.span`'s. Nothing to show is ``-``.
A schedule's time control is its catch-up policy, business calendar and DST rule (each saying the
default when the schedule leaves it out), and a backfill's progress.

Pure: every instant, ``now`` included, is passed in; no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime, timedelta, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from celeryapp.domain.times import NOTHING, parse_time, span


def zone_of(name: str | None) -> ZoneInfo:
    """The zone named, for showing times in: UTC when the name is missing or not a zone."""
    try:
        return ZoneInfo(name or "UTC")
    except (ZoneInfoNotFoundError, ValueError):
        return ZoneInfo("UTC")


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


def took(started: str | datetime | None, completed: str | datetime | None, now: datetime) -> str:
    """How long a run or step took; still running: how long so far (``12 s so far``); ``-`` if it
    has not started. A clock that went back shows as no time, not as a negative one."""
    start = parse_time(started) if isinstance(started, str) or started is None else started
    if start is None:
        return NOTHING
    end = parse_time(completed) if isinstance(completed, str) or completed is None else completed
    length = span(max(timedelta(0), (end or now) - start).total_seconds())
    return length if end is not None else f"{length} so far"


#: An instant as the contract writes it (``2026-11-24T14:33:00.000Z``), inside a text beat wrote:
#: a retry's reason, a slot record's summary.
ISO_INSTANT = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")


def instants_in(text: str, zone: tzinfo | str) -> str:
    """``text`` with the ISO instants in it written as people's times (:func:`clock`) in ``zone``."""
    return ISO_INSTANT.sub(lambda m: clock(parse_time(m.group()), zone), text)


#: What the default (no ``catchup``) does, as the contract says it.
CATCHUP_DEFAULT = "catch-up: latest (one run for missed slots)"
#: A cron schedule without ``dst``.
DST_DEFAULT = "DST: default rule (a skipped time runs at the change; a repeated one once, hourly ones twice)"
_REPEATED = {
    "first": "a repeated time runs at its first pass",
    "last": "a repeated time runs at its second pass",
    "both": "a repeated time runs at both passes",
}
_MISSING = {"shift": "a skipped time runs at the change", "skip": "a skipped time does not run that day"}
_ON_EXCLUDED = {"skip": "excluded days do not run", "next_business_day": "excluded days run the next business day"}
#: A run starting this long after its slot says which slot it is for (a backfill's, a catch-up's,
#: a late fire's); a regular run starts a moment after its slot, which is not worth saying.
SLOT_SHOWN_AFTER_S = 60.0
#: What made a backfill other than a request: a late fire's catch-up, a calendar's moved slot.
ORIGIN_WORDS = {"catchup": "catch-up", "moved": "moved slot"}
#: A backfill's run counts, in the order progress says them.
PROGRESS_COUNTS = ("running", "completed", "failed", "cancelled", "skipped")


def catchup_words(catchup: Mapping[str, Any] | None) -> str:
    """``catch-up: all (each missed slot of the last 1 d, at most 10 runs, oldest first)``."""
    policy = (catchup or {}).get("policy", "latest")
    if policy == "none":
        return "catch-up: none (missed slots are not made up; a slot fired late does not run)"
    if policy == "all":
        assert catchup is not None
        window, most = span(float(catchup.get("window", 86400))), catchup.get("max_runs", 10)
        runs = f"{most} run{'' if most == 1 else 's'}"
        return f"catch-up: all (each missed slot of the last {window}, at most {runs}, oldest first)"
    return CATCHUP_DEFAULT


def calendar_words(calendar: Mapping[str, Any] | None) -> str:
    """``calendar: 3 dates excluded, calendar uk-bank-holidays; excluded days do not run``."""
    if not calendar:
        return "calendar: none (every day runs)"
    said = []
    if dates := len(calendar.get("exclude") or []):
        said.append(f"{dates} date{'' if dates == 1 else 's'} excluded")
    if names := list(calendar.get("calendars") or []):
        said.append(f"calendar{'' if len(names) == 1 else 's'} {', '.join(names)}")
    then = _ON_EXCLUDED.get(str(calendar.get("on_excluded", "skip")), f"on_excluded {calendar.get('on_excluded')}")
    return f"calendar: {', '.join(said) or 'nothing excluded'}; {then}"


def dst_words(dst: Mapping[str, Any] | None, cron: str | None) -> str | None:
    """``DST: a repeated time runs at its second pass; a skipped time runs at the change (default)``;
    ``None`` for an interval schedule (it counts absolute time: DST changes nothing)."""
    if cron is None:
        return None
    if not dst:
        return DST_DEFAULT
    repeated = _REPEATED.get(str(dst.get("repeated")), "a repeated time: default rule")
    missing = _MISSING.get(str(dst.get("missing")), "a skipped time: default rule")
    return f"DST: {repeated}; {missing}"


def progress_words(backfill: Mapping[str, Any]) -> str:
    """``12/40 started, 2 running, 9 completed, 1 failed`` (counts of none left out; ``skipped``:
    slots passed over because a run of theirs existed already)."""
    counts = [
        f"{backfill[key]} {'passed over' if key == 'skipped' else key}" for key in PROGRESS_COUNTS if backfill[key]
    ]
    return ", ".join([f"{backfill['started']}/{backfill['total']} started", *counts])


def origin_words(backfill: Mapping[str, Any]) -> str:
    """``catch-up`` or ``moved slot`` for what beat's fire made; ``""`` for a request."""
    origin = str(backfill["origin"])
    return "" if origin == "request" else ORIGIN_WORDS.get(origin, origin)


def backfill_title(backfill: Mapping[str, Any]) -> str:
    """``#3 running`` or ``#4 catch-up completed``."""
    kind = origin_words(backfill)
    return f"#{backfill['id']} {kind + ' ' if kind else ''}{backfill['status']}"


def time_control_words(schedule: Mapping[str, Any]) -> list[str]:
    """A schedule object's catch-up, calendar and DST lines (no DST line for an interval)."""
    dst = dst_words(schedule.get("dst"), schedule.get("cron"))
    words = [catchup_words(schedule.get("catchup")), calendar_words(schedule.get("calendar"))]
    return words + ([dst] if dst else [])


def slot_differs(slot: datetime | str | None, started_at: datetime | str | None) -> bool:
    """Whether a run's slot is worth showing beside its start (objects' ISO strings or datetimes)."""
    slot_at = parse_time(slot) if isinstance(slot, str) or slot is None else slot
    started = parse_time(started_at) if isinstance(started_at, str) or started_at is None else started_at
    if slot_at is None or started is None:
        return False
    return abs((started - slot_at).total_seconds()) > SLOT_SHOWN_AFTER_S
