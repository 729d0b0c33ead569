"""Named business calendars: the files of ``CHORDBEAT_CALENDARS_DIR``, read bounded and kept while
they do not change.

A calendar's file is its name in the directory (:func:`celeryapp.domain.calendars.calendar_name_problem`
keeps names inside it). Apply refuses a definition naming a calendar that cannot be read, beat says
so loudly at start, and a fire that cannot read one starts nothing (:mod:`celeryapp.worker.firing`).
"""

from __future__ import annotations

import logging
import os
import threading
from datetime import date, datetime
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import select

from celeryapp.domain.business_moves import moved_to
from celeryapp.domain.calendar_fields import CalendarReader
from celeryapp.domain.calendars import (
    MAX_CALENDAR_BYTES,
    Calendar,
    CalendarError,
    calendar_name_problem,
    next_business_day,
    parse_calendar,
    slot_excluded,
)
from celeryapp.domain.definition import CalendarRules, OnExcluded
from celeryapp.domain.dst_rules import DstRules
from celeryapp.errors import ConfigError
from models import Schedule, ScheduleStatus, transaction

logger = logging.getLogger(__name__)

#: Files kept read at most; past it the cache starts again (a deployment has a handful).
MAX_CACHED_CALENDARS = 256
_cache: dict[str, tuple[tuple[int, int, int], frozenset[date]]] = {}
_cache_lock = threading.Lock()
#: How a slot's reason begins when the calendar cannot be read.
_UNREADABLE = "its calendar cannot be read"


def read_calendar(directory: str | None, name: str) -> frozenset[date]:
    """The dates of calendar ``name``; :class:`ConfigError` or :class:`CalendarError` say why not.
    Read again only when the file changed (its inode, size or modification time)."""
    if directory is None:
        raise ConfigError(
            "CHORDBEAT_CALENDARS_DIR is not set: this deployment has no calendar files, so no named calendar "
            "can be read (see docs/schedules.md)"
        )
    problem = calendar_name_problem(name)
    if problem is not None:
        raise CalendarError(problem)
    path = os.path.join(directory, name)
    try:
        with open(path, "rb") as stream:
            status = os.fstat(stream.fileno())
            version = (status.st_ino, status.st_size, status.st_mtime_ns)
            with _cache_lock:
                cached = _cache.get(path)
            if cached is not None and cached[0] == version:
                return cached[1]
            data = stream.read(MAX_CALENDAR_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"no file {name} in CHORDBEAT_CALENDARS_DIR ({directory})") from None
    except OSError as exc:
        raise ConfigError(f"{path} cannot be read ({exc.strerror or exc})") from None
    if len(data) > MAX_CALENDAR_BYTES:
        raise CalendarError(f"{path} is more than {MAX_CALENDAR_BYTES} bytes")
    try:
        dates = parse_calendar(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise CalendarError(f"{path} is not UTF-8 text (byte {exc.start})") from None
    except CalendarError as exc:
        raise CalendarError(f"{path}: {exc}") from None
    with _cache_lock:
        if len(_cache) >= MAX_CACHED_CALENDARS:
            _cache.clear()
        _cache[path] = (version, dates)
    return dates


def calendar_reader(directory: str | None) -> CalendarReader:
    """What the apply paths check a definition's named calendars with."""
    return lambda name: read_calendar(directory, name)


def schedule_calendar(directory: str | None, rules: CalendarRules) -> Calendar:
    """Every date ``rules`` exclude, with its reason; raises as :func:`read_calendar` does."""
    return Calendar.of(rules.exclude, [(name, read_calendar(directory, name)) for name in rules.calendars])


def unreadable_calendars(database_url: str, directory: str | None) -> list[str]:
    """For each active or paused schedule naming a calendar that cannot be read now, why: beat
    says these at start, since their slots will start nothing until the file is fixed."""
    with transaction(database_url, read_only=True) as session:
        rows = session.execute(
            # A calendar written as None is stored as JSON null, not SQL NULL: filtered here.
            select(Schedule.name, Schedule.calendar).where(
                Schedule.status.in_([ScheduleStatus.ACTIVE, ScheduleStatus.PAUSED])
            )
        ).all()
    problems = []
    for name, stored in rows:
        rules = CalendarRules.from_json(stored)
        for calendar in rules.calendars if rules is not None else ():
            try:
                read_calendar(directory, calendar)
            except (CalendarError, ConfigError) as exc:
                problems.append(f"schedule {name!r}: calendar {calendar!r} cannot be used: {exc}")
    return problems


def excluded_slots(directory: str | None, stored: Any, timezone: str, times: list[datetime]) -> list[str | None]:
    """For each of ``times``, why the schedule's stored ``calendar`` keeps it from running, or
    ``None``. A calendar that cannot be read keeps every one from running, saying so."""
    rules = CalendarRules.from_json(stored)
    if rules is None:
        return [None] * len(times)
    try:
        calendar = schedule_calendar(directory, rules)
    except (CalendarError, ConfigError) as exc:
        return [f"{_UNREADABLE}: {exc}"] * len(times)
    zone = ZoneInfo(timezone)
    return [slot_excluded(at, zone, calendar) for at in times]


def preview_exclusions(
    directory: str | None, stored: Any, timezone: str, dst: Any, times: list[datetime]
) -> list[str | None]:
    """What the previews say of each of ``times``: as :func:`excluded_slots`, and where the run of
    an excluded one moves when the calendar moves them ("...; moved to Mon 2026-12-28 18:00", the
    schedule's wall time), or why it does not. ``dst``: the stored ``dst`` object."""
    reasons = excluded_slots(directory, stored, timezone, times)
    if not moves_slots(stored):
        return reasons
    rules, zone = DstRules.from_json(dst), ZoneInfo(timezone)
    said: list[str | None] = []
    for at, reason in zip(times, reasons, strict=True):
        if reason is not None and not reason.startswith(_UNREADABLE):
            target = moved_slot(directory, stored, timezone, rules, at)
            if isinstance(target, datetime):
                reason += f"; moved to {target.astimezone(zone):%a %Y-%m-%d %H:%M}"
            else:
                reason += f"; not moved: {target}"
        said.append(reason)
    return said


def slot_calendar_reason(directory: str | None, stored: Any, timezone: str, slot: datetime) -> str | None:
    """Why the schedule's stored ``calendar`` keeps the slot at ``slot`` from running, or ``None``;
    a calendar that cannot be read is said as an error too: never a silent run, nor a silent skip."""
    (reason,) = excluded_slots(directory, stored, timezone, [slot])
    if reason is not None and reason.startswith(_UNREADABLE):
        logger.error("the slot at %s does not run: %s", slot.isoformat(), reason)
    return reason


def moves_slots(stored: Any) -> bool:
    """Whether the schedule's stored ``calendar`` moves an excluded slot's run (``on_excluded:
    next_business_day``) rather than skipping it."""
    rules = CalendarRules.from_json(stored)
    return rules is not None and rules.on_excluded is OnExcluded.NEXT_BUSINESS_DAY


def moved_slot(
    directory: str | None, stored: Any, timezone: str, dst: DstRules | None, slot: datetime
) -> datetime | str:
    """Where ``on_excluded: next_business_day`` moves the run of ``slot`` (on an excluded day): its
    wall time on the next business day; or why it does not move."""
    rules = CalendarRules.from_json(stored)
    if rules is None:
        return "the schedule has no calendar"
    try:
        calendar = schedule_calendar(directory, rules)
    except (CalendarError, ConfigError):
        return "its calendar cannot be read"
    zone = ZoneInfo(timezone)
    try:
        target = moved_to(slot, zone, calendar, dst)
    except CalendarError as exc:
        return str(exc)
    if target is None:
        wall = slot.astimezone(zone)
        day = next_business_day(wall.date(), calendar)
        return f"{wall:%H:%M} does not happen on {day.isoformat()} in {timezone} (dst.missing: skip)"
    return target
