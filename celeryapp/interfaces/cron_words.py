"""A cron expression in words, for the people who read ``chordbeat show`` and the dashboard:
``0 18 LW * *`` is "at 18:00 on the last weekday of the month", ``*/15 * * * *`` "every 15 minutes".

The words say what the fields say and no more: times are wall-clock times in the schedule's zone
(which the caller names), and a form without words of its own is quoted (``minutes 5-10/2``).
Pure: no I/O, no clock reads.
"""

from __future__ import annotations

from celeryapp.domain.cron import CronExpression
from celeryapp.domain.cron_fields import is_number

_WEEKDAYS = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_DAY_NAMES = {name[:3].lower(): i for i, name in enumerate(_WEEKDAYS[:7])}
_MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
_MONTH_NAMES = {name[:3].lower(): i for i, name in enumerate(_MONTHS, 1)}
_NTH = ("first", "second", "third", "fourth", "fifth")
#: Most hours listed one by one ("at 09:00, 12:00 and 17:00"); more read better as the field.
MAX_LISTED_TIMES = 6


def describe(expression: str) -> str:
    """``expression`` (a valid cron expression: CronError otherwise) in words."""
    minute, hour, dom, month, dow = CronExpression.parse(expression).text.split(" ")
    times, days, months = _times(minute, hour), _days(dom, dow), _months(month)
    if days == "every day" and times.startswith("every"):
        days = ""
    return " ".join(part for part in (times, days, months) if part)


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 22nd."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _clock(hour: int, minute: int) -> str:
    return f"{hour:02d}:{minute:02d}"


def _step(field: str) -> int | None:
    """n for ``*/n``."""
    base, slash, step = field.partition("/")
    return int(step) if base == "*" and slash and is_number(step) else None


def _times(minute: str, hour: str) -> str:
    hours = hour.split(",")
    if is_number(minute) and all(is_number(h) for h in hours) and len(hours) <= MAX_LISTED_TIMES:
        return "at " + _and([_clock(int(h), int(minute)) for h in sorted(hours, key=int)])
    every = "every minute" if minute == "*" or _step(minute) == 1 else None
    if _step(minute) not in (None, 1):
        every = f"every {_step(minute)} minutes"
    if every and (hour == "*" or _step(hour) == 1):
        return every
    if every and is_number(hour):
        return f"{every} from {_clock(int(hour), 0)} to {_clock(int(hour), 59)}"
    if is_number(minute) and (hour == "*" or _step(hour) == 1):
        return f"every hour at :{int(minute):02d}"
    if is_number(minute) and _step(hour):
        return f"every {_step(hour)} hours at :{int(minute):02d}"
    first, dash, last = hour.partition("-")
    if is_number(minute) and dash and is_number(first) and is_number(last):
        return f"every hour from {_clock(int(first), int(minute))} to {_clock(int(last), int(minute))}"
    if hour == "*":
        return f"at minutes {minute} of every hour"
    return f"at minutes {minute} of hours {hour}"


def _month_day(item: str) -> str:
    upper = item.upper()
    if upper == "L":
        return "the last day"
    if upper == "LW":
        return "the last weekday"
    if upper.endswith("W"):
        return f"the weekday nearest the {ordinal(int(item[:-1]))}"
    if is_number(item):
        return f"the {ordinal(int(item))}"
    first, dash, last = item.partition("-")
    if dash and is_number(first) and is_number(last):
        return f"the {ordinal(int(first))} to the {ordinal(int(last))}"
    if _step(item):
        return f"every {ordinal(_step(item) or 1)} day from the 1st"
    return f"days of month {item}"


def _weekday(text: str) -> str | None:
    if is_number(text):
        return _WEEKDAYS[int(text)]
    return _WEEKDAYS[_DAY_NAMES[text.lower()]] if text.lower() in _DAY_NAMES else None


def _week_day(item: str) -> tuple[str, bool]:
    """An item of the day-of-week field in words, and whether it counts within the month."""
    name, hash_, nth = item.partition("#")
    if hash_:
        return f"the {_NTH[int(nth) - 1]} {_weekday(name)}", True
    if item.upper().endswith("L"):
        return f"the last {_weekday(item[:-1])}", True
    first, dash, last = item.partition("-")
    if dash and _weekday(first) and _weekday(last):
        return f"{_weekday(first)} to {_weekday(last)}", False
    return _weekday(item) or f"days of week {item}", False


def _days(dom: str, dow: str) -> str:
    month_words = f"{_and([_month_day(i) for i in dom.split(',')])} of the month"
    week_items = [_week_day(i) for i in dow.split(",")]
    week_words = _and([words for words, _ in week_items])
    if any(in_month for _, in_month in week_items):
        week_words += " of the month"
    if dom == "*" and dow == "*":
        return "every day"
    if dow == "*":
        return f"on {month_words}"
    if dom == "*":
        return f"on {week_words}"
    if dom.startswith("*") or dow.startswith("*"):
        # Vixie cron: a day field starting with '*' ANDs the two.
        return f"on {month_words} when it is {week_words}"
    return f"on {month_words} or on {week_words}"


def _month(item: str) -> str:
    if is_number(item):
        return _MONTHS[int(item) - 1]
    if item.lower() in _MONTH_NAMES:
        return _MONTHS[_MONTH_NAMES[item.lower()] - 1]
    first, dash, last = item.partition("-")
    if dash and "/" not in last:
        return f"{_month(first)} to {_month(last)}"
    if _step(item):
        return f"every {ordinal(_step(item) or 1)} month from January"
    return f"months {item}"


def _months(month: str) -> str:
    return "" if month == "*" else f"in {_and([_month(i) for i in month.split(',')])}"
