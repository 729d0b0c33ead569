"""The next-fires preview (``chordbeat.next_fires``): a schedule's coming slots, each with its wall
time and, when its business calendar excludes it, why it will not run (and where its run moves,
with ``on_excluded: next_business_day``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from celeryapp.domain.cadence import next_fire_times
from celeryapp.domain.dst_rules import DstRules
from celeryapp.domain.limits import short_repr, type_name
from celeryapp.domain.times import iso
from celeryapp.errors import InvalidArgument
from celeryapp.interfaces.arguments import name_arg
from celeryapp.interfaces.dst_notes import dst_notes
from celeryapp.scheduling.calendar_files import preview_exclusions
from celeryapp.scheduling.store import find_schedule
from models import transaction, utcnow

if TYPE_CHECKING:
    from celeryapp.application import ChordbeatCelery

#: Slots one preview lists at most (the contract's bound).
MAX_NEXT_FIRES = 100


def count_arg(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_NEXT_FIRES:
        got = short_repr(value) if isinstance(value, int) and not isinstance(value, bool) else type_name(value)
        raise InvalidArgument("count", f"must be an integer between 1 and {MAX_NEXT_FIRES}, got {got}")
    return value


def next_fires(app: ChordbeatCelery, name: str, count: int = 10) -> list[dict[str, Any]]:
    """``[{"at", "local", "excluded", "dst", "version"}]``: the next ``count`` slots (a paused
    schedule's: those it would fire if resumed; a done or dead one has none), in UTC and on the
    schedule's wall clock; ``dst`` says what the schedule's DST rule did to a slot on a day the
    clocks change; ``version``: the definition version its run would run (the current one: a run
    pins the version current when it starts)."""
    name, count = name_arg(name), count_arg(count)
    now = utcnow()
    with transaction(app.settings.database_url, read_only=True) as session:
        schedule = find_schedule(session, name)
        times = next_fire_times(schedule, now, count)
        stored, timezone, cron, dst = schedule.calendar, schedule.timezone, schedule.cron, schedule.dst
        version = schedule.version
    zone = ZoneInfo(timezone)
    reasons = preview_exclusions(app.settings.calendars_dir, stored, timezone, dst, times)
    notes = dst_notes(cron, zone, DstRules.from_json(dst), now, times)
    return [
        {"at": iso(at), "local": at.astimezone(zone).isoformat(), "excluded": reason, "dst": note, "version": version}
        for at, reason, note in zip(times, reasons, notes, strict=True)
    ]
