"""Times and cadences in words, as the dashboard shows them. Pure: every instant is passed in."""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

_DAY_NAMES = ("Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_WEEKDAY_LISTS = {
    "1-5": "Mon to Fri",
    "mon-fri": "Mon to Fri",
    "0,6": "Sat and Sun",
    "6,0": "Sat and Sun",
    "sat,sun": "Sat and Sun",
}


def _is_number(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _days(field: str) -> str | None:
    lowered = field.lower()
    if lowered in _WEEKDAY_LISTS:
        return _WEEKDAY_LISTS[lowered]
    parts = lowered.split(",")
    if all(_is_number(p) and int(p) <= 7 for p in parts):
        return ", ".join(_DAY_NAMES[int(p)] for p in parts)
    return None


def cron_words(expression: str) -> str:
    """Common cron patterns in words (``02:00 every day``); anything else as ``cron <expr>``."""
    fields = expression.split()
    if len(fields) != 5:
        return f"cron {expression}"
    minute, hour, dom, month, dow = fields
    if month != "*" or dom != "*":
        return f"cron {expression}"
    if _is_number(minute) and _is_number(hour):
        at = f"{int(hour):02d}:{int(minute):02d}"
        if dow == "*":
            return f"{at} every day"
        days = _days(dow)
        return f"{at} on {days}" if days else f"cron {expression}"
    if dow != "*":
        return f"cron {expression}"
    if minute == "*" and hour == "*":
        return "every minute"
    if minute.startswith("*/") and _is_number(minute[2:]) and hour == "*":
        return f"every {int(minute[2:])} min"
    if _is_number(minute) and hour == "*":
        return f"hourly at :{int(minute):02d}"
    if _is_number(minute) and hour.startswith("*/") and _is_number(hour[2:]):
        return f"every {int(hour[2:])} h at :{int(minute):02d}"
    return f"cron {expression}"


def seconds_words(seconds: float) -> str:
    """A duration as people say it: ``45 s``, ``5 min``, ``5 h 12 min``, ``3 d 4 h``."""
    seconds = abs(seconds)
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds >= 10 or seconds == int(seconds) else f"{seconds:.1f} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        rest = int(seconds % 60)
        return f"{minutes} min {rest} s" if rest and minutes < 10 else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def cadence_words(cron: str | None, every_s: float | None, timezone: str) -> str:
    if cron is not None:
        return f"{cron_words(cron)}, {timezone}"
    assert every_s is not None
    return f"every {seconds_words(every_s)}"


def relative(at: datetime, now: datetime) -> str:
    """``in 5 h 12 min`` or ``3 min ago``."""
    delta = (at - now).total_seconds()
    if abs(delta) < 1:
        return "now"
    return f"in {seconds_words(delta)}" if delta > 0 else f"{seconds_words(delta)} ago"


def in_zone(at: datetime, zone: str) -> str:
    """``2026-11-22 02:00 GMT (+00:00)``: the wall clock there, its abbreviation and UTC offset."""
    local = at.astimezone(ZoneInfo(zone))
    offset = local.strftime("%z")
    return f"{local:%Y-%m-%d %H:%M:%S} {local.tzname()} ({offset[:3]}:{offset[3:]})"


def duration(start: datetime | None, end: datetime | None, now: datetime) -> str:
    if start is None:
        return ""
    return seconds_words(((end or now) - start) / timedelta(seconds=1))
