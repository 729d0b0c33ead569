"""A definition's ``calendar`` read from untrusted JSON, every problem at once.

``{"exclude": ["2026-12-25"], "calendars": ["uk-bank-holidays"], "on_excluded": "skip"}``: its own
dates, and names of calendar files of the ``CHORDBEAT_CALENDARS_DIR`` directory. A named calendar
that cannot be read is refused when the definition is applied (and said at beat start), never
found out by a slot that silently fires.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import date, datetime
from typing import Any

from celeryapp.domain.calendars import CalendarError, calendar_name_problem, parse_date
from celeryapp.domain.definition import CalendarRules, OnExcluded
from celeryapp.domain.fields import distinct_names, refuse_unknown, require_mapping
from celeryapp.domain.limits import short_repr, type_name
from celeryapp.domain.problems import Problems
from celeryapp.errors import ConfigError, DefinitionError

CALENDAR_FIELDS = frozenset({"exclude", "calendars", "on_excluded"})
#: Dates one definition may list itself; more belong in a calendar file.
MAX_EXCLUDE_DATES = 1000
#: Named calendars one definition may list.
MAX_CALENDARS = 20

#: Reads a named calendar's dates; raises :class:`CalendarError` or :class:`ConfigError` saying why
#: it cannot (no such file, unreadable, a bad line, ``CHORDBEAT_CALENDARS_DIR`` not set).
CalendarReader = Callable[[str], frozenset[date]]


def parse_calendar_field(raw: Mapping[str, Any]) -> CalendarRules | None:
    """The definition's ``calendar`` (``None`` when absent or null)."""
    value = raw.get("calendar")
    if value is None:
        return None
    calendar = require_mapping(value, "calendar")
    problems = Problems()
    problems.check(refuse_unknown, calendar, CALENDAR_FIELDS, "calendar")
    exclude = problems.check(_exclude, calendar.get("exclude"))
    names = problems.check(_calendars, calendar.get("calendars"))
    interval = raw.get("cron") is None and raw.get("every") is not None
    on_excluded = problems.check(_on_excluded, calendar.get("on_excluded"), interval)
    if not problems and not exclude and not names:
        problems.add(DefinitionError("calendar", "must give exclude dates or calendars (leave calendar out for none)"))
    problems.raise_any()
    assert exclude is not None and names is not None and on_excluded is not None
    return CalendarRules(exclude=exclude, calendars=names, on_excluded=on_excluded)


def _listed(value: Any, path: str, most: int, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise DefinitionError(path, f"must be a list of {what}, got {type_name(value)}")
    if len(value) > most:
        raise DefinitionError(path, f"must list at most {most} {what}, got {len(value)}")
    return value


def _exclude(value: Any) -> tuple[date, ...]:
    path = "calendar.exclude"
    problems = Problems()
    first: dict[date, int] = {}
    for index, entry in enumerate(_listed(value, path, MAX_EXCLUDE_DATES, "dates")):
        if isinstance(entry, date) and not isinstance(entry, datetime):
            day = entry  # YAML reads an unquoted 2026-12-25 as a date
        elif not isinstance(entry, str):
            problems.add(
                DefinitionError(f"{path}[{index}]", f"must be a date written YYYY-MM-DD, got {type_name(entry)}")
            )
            continue
        else:
            try:
                day = parse_date(entry)
            except CalendarError as exc:
                problems.add(DefinitionError(f"{path}[{index}]", str(exc)))
                continue
        if day in first:
            problems.add(
                DefinitionError(f"{path}[{index}]", f"{day.isoformat()} is listed twice (also {path}[{first[day]}])")
            )
        else:
            first[day] = index
    problems.raise_any()
    return tuple(first)


def _calendars(value: Any) -> tuple[str, ...]:
    path = "calendar.calendars"
    return distinct_names(_listed(value, path, MAX_CALENDARS, "calendar names"), path, calendar_name_problem)


def _on_excluded(value: Any, interval: bool) -> OnExcluded:
    path = "calendar.on_excluded"
    if value is None:
        return OnExcluded.SKIP
    choices = ", ".join(choice.value for choice in OnExcluded)
    if not isinstance(value, str) or value not in {choice.value for choice in OnExcluded}:
        shown = short_repr(value) if isinstance(value, str) else type_name(value)
        raise DefinitionError(path, f"must be one of {choices}, got {shown}")
    if value == OnExcluded.NEXT_BUSINESS_DAY and interval:
        # A moved run keeps its slot's wall time on the next business day: an interval's slots
        # are absolute time, with no wall time of their own to keep.
        raise DefinitionError(
            path,
            "'next_business_day' is for cron schedules only: an 'every' schedule's slots have no wall time to keep",
        )
    return OnExcluded(value)


def check_known_calendars(rules: CalendarRules | None, read: CalendarReader) -> None:
    """Every calendar ``rules`` names can be read now (its file exists and every line is a date)."""
    if rules is None:
        return
    problems = Problems()
    for index, name in enumerate(rules.calendars):
        try:
            read(name)
        except (CalendarError, ConfigError) as exc:
            problems.add(DefinitionError(f"calendar.calendars[{index}]", f"calendar {name!r} cannot be used: {exc}"))
    problems.raise_any()
