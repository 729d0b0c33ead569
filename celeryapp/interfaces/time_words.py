"""A schedule's time control in people's words, as ``chordbeat show``, ``chordbeat backfills`` and
the dashboard say it: its catch-up policy, business calendar and DST rule (each saying the default
when the schedule leaves it out), and a backfill's progress.

Pure functions of the service's JSON (the schedule's ``catchup``, ``calendar`` and ``dst``, a
backfill object): no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from celeryapp.domain.times import parse_time, span

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
