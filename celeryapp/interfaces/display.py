"""How the CLI shows times, durations and states to people: one format everywhere.

A time is shown in the schedule's own zone with its UTC offset, to the second, followed by how
far it is from now (``2026-11-22 02:00:00 +00:00 GMT, in 5 h 12 min``). Pure functions: no I/O.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from celeryapp.domain.cron import CronExpression

#: Colour of each stored state (schedule, execution, worker task and activity states).
STATE_STYLES = {
    "active": "green",
    "paused": "yellow",
    "done": "blue",
    "dead": "bold red",
    "in_progress": "cyan",
    "processing": "cyan",
    "queued": "bright_black",
    "waiting_for_previous_step": "bright_black",
    "completed": "green",
    "complete": "green",
    "complete_with_warning": "yellow",
    "complete_with_error": "dark_orange",
    "failed": "bold red",
    "failed_with_error": "bold red",
    "cancelled": "magenta",
}
#: Step states that count as trouble in their group (its bar turns red or yellow).
FAILED_STEP = frozenset({"failed_with_error", "cancelled"})
WARNED_STEP = frozenset({"complete_with_warning", "complete_with_error"})


def state_style(state: str) -> str:
    return STATE_STYLES.get(state, "")


def parse_time(value: str | None) -> datetime | None:
    """An ISO 8601 timestamp of the contract (UTC with a ``Z``)."""
    if not value:
        return None
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def zone_of(name: str | None) -> ZoneInfo:
    try:
        return ZoneInfo(name or "UTC")
    except (ZoneInfoNotFoundError, ValueError):
        return ZoneInfo("UTC")


def _plural_free(parts: list[tuple[int, str]]) -> str:
    shown = [f"{n} {unit}" for n, unit in parts if n][:2]
    return " ".join(shown) if shown else f"0 {parts[-1][1]}"


def span(seconds: float) -> str:
    """A length of time for people: ``0.4 s``, ``12 s``, ``3 min 4 s``, ``5 h 12 min``, ``2 d 3 h``."""
    seconds = abs(seconds)
    if seconds < 10:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return _plural_free([(days, "d"), (hours, "h"), (minutes, "min"), (secs, "s")])


def relative(moment: datetime, now: datetime) -> str:
    """``in 5 h 12 min``, ``3 min ago`` or ``now``."""
    delta = (moment - now).total_seconds()
    if abs(delta) < 1:
        return "now"
    text = span(delta) if abs(delta) >= 10 else f"{abs(delta):.0f} s"
    return f"in {text}" if delta > 0 else f"{text} ago"


def clock(moment: datetime, zone: ZoneInfo) -> str:
    """``2026-11-22 02:00:00 +00:00 GMT``: the zone's wall time, its offset and abbreviation."""
    local = moment.astimezone(zone)
    offset = local.strftime("%z")
    return f"{local:%Y-%m-%d %H:%M:%S} {offset[:3]}:{offset[3:]} {local.tzname()}"


def when(value: str | datetime | None, zone: ZoneInfo, now: datetime) -> str:
    """A time as shown everywhere: :func:`clock`, then :func:`relative`; ``-`` if there is none.

    ``now`` is the reference clock's (``models.utcnow``): a host clock that is off would make every
    "3 min ago" wrong by as much."""
    moment = parse_time(value) if isinstance(value, str) or value is None else value
    if moment is None:
        return "-"
    return f"{clock(moment, zone)}, {relative(moment, now)}"


def took(started: str | None, completed: str | None, now: datetime) -> str:
    """How long a run or step took; still running: how long so far (``12 s so far``)."""
    start = parse_time(started)
    if start is None:
        return "-"
    end = parse_time(completed)
    if end is None:
        return f"{span((now - start).total_seconds())} so far"
    return span(max(timedelta(0), end - start).total_seconds())


def upcoming(schedule: dict[str, Any], count: int) -> list[datetime]:
    """The schedule's next fire times, in its own time zone."""
    zone = ZoneInfo(schedule["timezone"])
    first = schedule.get("next_run_at")
    if first is None:
        return []
    start = datetime.fromisoformat(first.replace("Z", "+00:00"))
    if schedule.get("cron"):
        times = [start, *CronExpression.parse(schedule["cron"]).upcoming(start, zone, count - 1)]
    else:
        times = [start + timedelta(seconds=schedule["every"] * i) for i in range(count)]
    return [t.astimezone(zone) for t in times[:count]]


def step_states(execution: dict[str, Any]) -> dict[tuple[int, str], tuple[str, int]]:
    """Each step's current state and attempt, in run order: its open task or its latest activity."""
    states: dict[tuple[int, str], tuple[str, int]] = {}
    for a in execution["activities"]:  # ordered by attempt within a step
        states[(a["step_index"], a["step"])] = (a["status"], a["attempt"])
    for t in execution["tasks"]:
        key = (t["step_index"], t["step"])
        running = states.get(key, ("", 0))
        # A processing task's running attempt already shows as its in-progress activity.
        if not (running[0] == "in_progress" and running[1] == t["attempt"]):
            states[key] = (t["status"], t["attempt"])
    return dict(sorted(states.items(), key=lambda item: item[0][0]))
