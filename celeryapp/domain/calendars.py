"""Business calendars: the dates a schedule does not run on, and why.

A calendar file holds one ISO date (``2026-12-25``) per line; ``#`` starts a comment, blank lines
are ignored. Files come from the deployment (``CHORDBEAT_CALENDARS_DIR``) and are read by
:mod:`celeryapp.scheduling.calendar_files`; this module only reads their text, bounded, and
answers whether a day is excluded. A slot's day is its date on the schedule's wall clock.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date, datetime, timedelta, tzinfo

from celeryapp.domain.limits import short_repr
from celeryapp.errors import ChordbeatError

#: A calendar file may hold at most this many lines (a century of holidays is a few thousand)...
MAX_CALENDAR_LINES = 100_000
#: ...and this many bytes: past either, it is refused unread, not walked.
MAX_CALENDAR_BYTES = 4 * 1024 * 1024
#: A calendar's name is its file's name in the directory: no ``/``, no leading ``.``, so a name can
#: never reach outside it (``../etc/passwd`` is not a name).
CALENDAR_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: ``YYYY-MM-DD`` in ASCII digits (``\d`` would take other scripts' digits).
DATE_PATTERN = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
#: A business day is found within this many days of an excluded one, or the calendar is refused as
#: excluding (nearly) everything: the search is bounded.
MAX_BUSINESS_DAY_SEARCH_DAYS = 366
#: Saturday and Sunday (``date.weekday()``), never business days.
WEEKEND = frozenset({5, 6})
#: The reason of a date the definition's own ``calendar.exclude`` lists.
INLINE_REASON = "excluded by the schedule's calendar.exclude"


class CalendarError(ChordbeatError, ValueError):
    """A calendar's text or name that cannot be used; the message says where and why."""


def calendar_name_problem(name: object) -> str | None:
    """Why ``name`` is not a calendar's name (without repeating a long value), or ``None``."""
    if not isinstance(name, str):
        return f"must be a calendar name, got {type(name).__name__}"
    if CALENDAR_NAME_PATTERN.fullmatch(name) and ".." not in name:
        return None
    return (
        f"{short_repr(name)} is not a calendar name: 1 to 64 of letters, digits, '.', '_' and '-', starting "
        "with a letter or digit (the name of a file in CHORDBEAT_CALENDARS_DIR; no '/' or '..')"
    )


def parse_date(text: str, *, line: int | None = None) -> date:
    """An ISO date ``YYYY-MM-DD`` that exists; :class:`CalendarError` says why not. With ``line``
    (a calendar file's), the refusal names the line, never its text: a caller can name any file of
    the calendars directory, which may hold anything."""
    if not DATE_PATTERN.fullmatch(text):
        if line is None:
            raise CalendarError(f"{short_repr(text)} is not a date written YYYY-MM-DD")
        raise CalendarError(f"line {line} is not a date written YYYY-MM-DD (its text is not shown)")
    try:
        return date.fromisoformat(text)
    except ValueError as exc:
        shown = text if line is None else f"line {line}"
        raise CalendarError(f"{shown} is not a date that exists ({exc})") from None


def parse_calendar(text: str) -> frozenset[date]:
    """The dates of a calendar file's text; :class:`CalendarError` names the first bad line."""
    if len(text) > MAX_CALENDAR_BYTES:
        # More characters than the bound is more bytes too.
        raise CalendarError(f"is more than {MAX_CALENDAR_BYTES} bytes")
    # Counted before splitting: a million short lines are refused without building a million strings.
    if text.count("\n") + (0 if text.endswith("\n") else 1) > MAX_CALENDAR_LINES:
        raise CalendarError(f"has more than {MAX_CALENDAR_LINES} lines")
    dates: set[date] = set()
    for number, line in enumerate(text.splitlines(), start=1):
        content = line.partition("#")[0].strip()
        if not content:
            continue
        dates.add(parse_date(content, line=number))
    return frozenset(dates)


@dataclass(frozen=True)
class Calendar:
    """Every excluded date of one schedule with its reason: its own ``exclude`` dates and those
    of the named calendars it lists (the first listed names the reason)."""

    reasons: Mapping[date, str]

    @classmethod
    def of(cls, exclude: Iterable[date], named: Iterable[tuple[str, Iterable[date]]] = ()) -> Calendar:
        reasons: dict[date, str] = dict.fromkeys(exclude, INLINE_REASON)
        for name, dates in named:
            for day in dates:
                reasons.setdefault(day, f"in calendar {name!r}")
        return cls(reasons)


def excluded_reason(day: date, calendar: Calendar) -> str | None:
    """Why ``day`` is excluded, or ``None`` when the schedule runs on it."""
    return calendar.reasons.get(day)


def slot_excluded(slot: datetime, zone: tzinfo, calendar: Calendar) -> str | None:
    """Why the slot at ``slot`` does not run (its day on the schedule's wall clock is excluded), or
    ``None``."""
    return calendar.reasons.get(slot.astimezone(zone).date())


def is_excluded(day: date, calendar: Calendar) -> bool:
    return day in calendar.reasons


def next_business_day(day: date, calendar: Calendar) -> date:
    """The first day after ``day`` that is a weekday and not excluded."""
    for offset in range(1, MAX_BUSINESS_DAY_SEARCH_DAYS + 1):
        try:
            candidate = day + timedelta(days=offset)
        except OverflowError:
            break
        if candidate.weekday() not in WEEKEND and candidate not in calendar.reasons:
            return candidate
    raise CalendarError(f"no business day within {MAX_BUSINESS_DAY_SEARCH_DAYS} days after {day.isoformat()}")
