"""What the dashboard writes for people: cadences in words (``02:00 every day, Europe/London``),
states in words with their badge's colour (:mod:`celeryapp.interfaces.display`'s labels, as the
CLI shows them), and instants as :func:`celeryapp.interfaces.time_words.stamp` writes them: the schedule's
zone with its offset, the viewer's zone beside it (filled in by the browser, which alone knows it,
from the ``datetime`` attribute), and how long ago.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from tornado.escape import xhtml_escape

from celeryapp.domain.cron_fields import CronError, is_number
from celeryapp.domain.times import NOTHING, iso, span
from celeryapp.interfaces.cron_words import describe
from celeryapp.interfaces.display import COMPLETED_WITH_WARNINGS, label, run_state
from celeryapp.interfaces.time_words import clock, relative, zone_of

#: A completed run with warnings: its badge's colour (yellow; the stored status says completed).
WARNINGS_CLASS = "warnings"
#: The grid's legend: each colour class and its words, runs' then steps' own.
LEGEND = (
    ("completed", label("completed")),
    (WARNINGS_CLASS, COMPLETED_WITH_WARNINGS),
    ("failed", label("failed")),
    ("cancelled", label("cancelled")),
    ("in_progress", label("in_progress")),
    ("complete_with_warning", label("complete_with_warning")),
    ("complete_with_error", label("complete_with_error")),
    ("queued", label("queued")),
    ("waiting_for_previous_step", label("waiting_for_previous_step")),
)


#: A grid cell's mark beside its colour: a state is never told by colour alone (WCAG 1.4.1).
SYMBOLS = {
    "completed": "✓",
    "complete": "✓",
    WARNINGS_CLASS: "!",
    "complete_with_warning": "!",
    "failed": "✗",
    "failed_with_error": "✗",
    "complete_with_error": "✗",
    "cancelled": "\u2013",
    "in_progress": "▸",
    "processing": "▸",
    "queued": "·",
    "waiting_for_previous_step": "…",
    "waiting_for_limit": "…",
}


def symbol(state: str) -> str:
    """The mark a grid cell of ``state`` shows (``?`` for a state without one)."""
    return SYMBOLS.get(state, "?")


def run_badge(status: str, warned: bool) -> tuple[str, str]:
    """A run's badge: its colour class and its words ("completed with warnings" in yellow)."""
    words = run_state({"status": status, "steps": {"complete_with_warning": 1} if warned else {}})
    return (WARNINGS_CLASS if words == COMPLETED_WITH_WARNINGS else status), words


def execution_badge(execution: dict[str, Any]) -> tuple[str, str]:
    """The badge of a whole execution object (its activities tell whether it warned)."""
    words = run_state(execution)
    return (WARNINGS_CLASS if words == COMPLETED_WITH_WARNINGS else str(execution["status"])), words


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)


def when(moment: datetime | None, zone: ZoneInfo | str, now: datetime) -> str:
    """An instant as markup: the schedule's zone with its offset, a ``<time class="here">`` the
    browser fills with the viewer's wall time when their offset differs (``, 07:30 IST here``),
    and how far from now. Escaped here: templates insert it raw."""
    if moment is None:
        return NOTHING
    return (
        f'<span class="when">{xhtml_escape(clock(moment, zone))}{here_tag(moment, zone)}, '
        f'<span class="rel">{xhtml_escape(relative(moment, now))}</span></span>'
    )


def here_tag(moment: datetime, zone: ZoneInfo | str) -> str:
    """The ``<time class="here">`` the browser fills with ``, 07:30 IST here`` (the viewer's wall
    time of ``moment``) when the viewer's offset differs from ``zone``'s then."""
    local = moment.astimezone(zone_of(zone) if isinstance(zone, str) else zone)
    offset = local.utcoffset()
    minutes = 0 if offset is None else int(offset.total_seconds() // 60)
    return (
        f'<time class="here" datetime="{iso(moment, timespec="seconds")}" data-offset="{minutes}" '
        f'data-day="{local:%Y-%m-%d}"></time>'
    )


def short_clock(moment: datetime | None, zone: ZoneInfo | str) -> str:
    """A grid column's date: ``11-22 02:00`` in the schedule's zone."""
    if moment is None:
        return NOTHING
    return f"{moment.astimezone(zone_of(zone) if isinstance(zone, str) else zone):%m-%d %H:%M}"


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
    """Common cron patterns in short words (``02:00 every day``); anything else in
    :func:`celeryapp.interfaces.cron_words.describe`'s (``at 18:00 on the last weekday of the month``)."""
    fields = expression.split()
    if len(fields) != 5:
        return _described(expression)
    minute, hour, dom, month, dow = fields
    if month != "*" or dom != "*":
        return _described(expression)
    if is_number(minute) and is_number(hour):
        at = f"{int(hour):02d}:{int(minute):02d}"
        if dow == "*":
            return f"{at} every day"
        days = _days(dow)
        return f"{at} on {days}" if days else _described(expression)
    if dow != "*":
        return _described(expression)
    if minute == "*" and hour == "*":
        return "every minute"
    if minute.startswith("*/") and is_number(minute[2:]) and hour == "*":
        return f"every {int(minute[2:])} min"
    if is_number(minute) and hour == "*":
        return f"hourly at :{int(minute):02d}"
    if is_number(minute) and hour.startswith("*/") and is_number(hour[2:]):
        return f"every {int(hour[2:])} h at :{int(minute):02d}"
    return _described(expression)


def _described(expression: str) -> str:
    """An expression without a short form, L, W and # included, in :mod:`cron_words`' words."""
    try:
        return describe(expression)
    except CronError:  # stored expressions were checked when applied; never hide one behind an error
        return f"cron {expression}"


def cadence_words(cron: str | None, every_s: float | None, timezone: str) -> str:
    if cron is not None:
        return f"{cron_words(cron)}, {timezone}"
    assert every_s is not None
    return f"every {span(every_s)}"
