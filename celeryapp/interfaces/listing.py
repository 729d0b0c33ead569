"""What the CLI's lists read besides their page: the schedules' time zones, and the next page's hint.

Lists come in pages (``list_executions`` at most 500 summaries, ``list_schedules`` 5,000 schedules);
a command reads only what it shows.
"""

from __future__ import annotations

import shlex
from zoneinfo import ZoneInfo

from celeryapp.client import ChordbeatClient, each_schedule
from celeryapp.interfaces.time_words import zone_of

#: Up to this many schedules' zones are asked for one by one; for more, every schedule is read a
#: page at a time (fewer calls than one per name).
ZONE_LOOKUPS = 20
#: Schedules per call when ``chordbeat list`` reads them all.
SCHEDULE_PAGE = 500


def zones_of(client: ChordbeatClient, names: set[str]) -> dict[str, ZoneInfo]:
    """The time zone of each named schedule that still exists (a deleted one's runs show in UTC)."""
    if len(names) > ZONE_LOOKUPS:
        return {s["name"]: zone_of(s["timezone"]) for s in each_schedule(client, SCHEDULE_PAGE) if s["name"] in names}
    zones = {}
    for name in sorted(names):
        try:
            zones[name] = zone_of(client.get_schedule(name)["timezone"])
        except LookupError:  # NotFound: deleted since
            continue
    return zones


def next_page_hint(
    shown: int, limit: int, last_id: int, schedule: str | None, status: str | None, version: int | None = None
) -> str | None:
    """The command for the next (older) page, when this one was full."""
    if shown < limit:
        return None
    given = (("schedule", schedule), ("status", status), ("version", None if version is None else str(version)))
    filters = "".join(f" --{key} {shlex.quote(value)}" for key, value in given if value)
    return f"more: chordbeat executions{filters} --limit {limit} --before {last_id}"
