"""Cadences in words, as the dashboard shows them (``02:00 every day, Europe/London``). Times and
lengths of time are written by :mod:`celeryapp.domain.times`, as the CLI writes them."""

from __future__ import annotations

from celeryapp.domain.cron import is_number
from celeryapp.domain.times import span

_DAY_NAMES = ("Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_WEEKDAY_LISTS = {
    "1-5": "Mon to Fri",
    "mon-fri": "Mon to Fri",
    "0,6": "Sat and Sun",
    "6,0": "Sat and Sun",
    "sat,sun": "Sat and Sun",
}


def _days(field: str) -> str | None:
    lowered = field.lower()
    if lowered in _WEEKDAY_LISTS:
        return _WEEKDAY_LISTS[lowered]
    parts = lowered.split(",")
    if all(is_number(p) and int(p) <= 7 for p in parts):
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
    if is_number(minute) and is_number(hour):
        at = f"{int(hour):02d}:{int(minute):02d}"
        if dow == "*":
            return f"{at} every day"
        days = _days(dow)
        return f"{at} on {days}" if days else f"cron {expression}"
    if dow != "*":
        return f"cron {expression}"
    if minute == "*" and hour == "*":
        return "every minute"
    if minute.startswith("*/") and is_number(minute[2:]) and hour == "*":
        return f"every {int(minute[2:])} min"
    if is_number(minute) and hour == "*":
        return f"hourly at :{int(minute):02d}"
    if is_number(minute) and hour.startswith("*/") and is_number(hour[2:]):
        return f"every {int(hour[2:])} h at :{int(minute):02d}"
    return f"cron {expression}"


def cadence_words(cron: str | None, every_s: float | None, timezone: str) -> str:
    if cron is not None:
        return f"{cron_words(cron)}, {timezone}"
    assert every_s is not None
    return f"every {span(every_s)}"
