"""The fields of a 5-field cron expression: numbers, names, ranges, steps and lists, and the two
day fields' special forms with the meanings cronsim (the peers' reference) gives them:

* day of month: ``L`` the last day, ``LW`` the last weekday (Monday to Friday) of the month, and
  ``15W`` the weekday nearest the 15th within the same month (Quartz's meaning: cronsim has no
  ``nW``): a Saturday moves to the Friday before, a Sunday to the Monday after, never across the
  month's first or last day (``1W`` on a Saturday is Monday the 3rd);
* day of week: ``5L`` the last Friday of the month, ``1#2`` its second Monday (``#1`` to ``#5``).

Everything here is pure: no I/O, no clock reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from celeryapp.errors import ChordbeatError

#: Longest accepted expression; anything longer is not a hand-written schedule.
MAX_LENGTH = 200
_MONTHS = {
    m: i for i, m in enumerate(["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"], 1)
}
_DAYS = {d: i for i, d in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])}
#: Days in each month of a leap year: a day of month beyond these never occurs.
LONGEST_MONTH = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
#: Most times a weekday occurs in one month (``#5``).
MAX_NTH = 5
_SATURDAY, _SUNDAY = 6, 0


class CronError(ChordbeatError, ValueError):
    """Raised for an expression that is not a valid 5-field cron expression."""


@dataclass(frozen=True)
class Field:
    name: str
    low: int
    high: int
    #: Largest step: the number of distinct values (``*/60`` is minute 0, ``*/61`` a mistake).
    max_step: int
    names: dict[str, int] | None = None


FIELDS = (
    Field("minute", 0, 59, 60),
    Field("hour", 0, 23, 24),
    Field("day of month", 1, 31, 31),
    Field("month", 1, 12, 12, _MONTHS),
    Field("day of week", 0, 7, 7, _DAYS),
)
DAY_OF_MONTH, DAY_OF_WEEK = FIELDS[2], FIELDS[4]


def is_number(text: str) -> bool:
    """A cron field's number: ASCII digits only (str.isdigit alone accepts '¹' and '٣')."""
    return text.isascii() and text.isdigit()


def _value(text: str, field: Field) -> int:
    if field.names and text.isascii() and text.lower() in field.names:
        return field.names[text.lower()]
    if not is_number(text):
        kind = "a number or a name" if field.names else "a number"
        hint = ""
        if field not in (DAY_OF_MONTH, DAY_OF_WEEK) and any(c in text.upper() for c in "LW#"):
            hint = " (L, W and # mean something only in the day fields)"
        raise CronError(f"{field.name} field: {text!r} is not {kind}{hint}")
    value = int(text)
    if not field.low <= value <= field.high:
        raise CronError(f"{field.name} field: {value} is outside {field.low}-{field.high}")
    return value


def _parse_part(part: str, field: Field) -> range:
    base, slash, step_text = part.partition("/")
    if not base:
        raise CronError(f"{field.name} field: {part!r} has nothing before '/'")
    step = 1
    if slash:
        if not is_number(step_text) or not 1 <= int(step_text) <= field.max_step:
            raise CronError(f"{field.name} field: step {step_text!r} must be a number from 1 to {field.max_step}")
        step = int(step_text)
    if base == "*":
        low, high = field.low, field.high
    elif "-" in base:
        first, _, last = base.partition("-")
        low, high = _value(first, field), _value(last, field)
        if low > high:
            raise CronError(f"{field.name} field: range {base!r} runs backwards")
    else:
        low = _value(base, field)
        high = field.high if slash else low
    return range(low, high + 1, step)


def _items(text: str, field: Field) -> list[str]:
    items = text.split(",")
    if not all(items):
        raise CronError(f"{field.name} field: empty list item in {text!r}")
    return items


def parse_field(text: str, field: Field) -> frozenset[int]:
    """A plain field's values (numbers, names, ranges, steps, lists)."""
    values: set[int] = set()
    for part in _items(text, field):
        values.update(_parse_part(part, field))
    return frozenset(values)


def split(text: str) -> list[str]:
    if len(text) > MAX_LENGTH:
        raise CronError(f"is {len(text)} characters long, at most {MAX_LENGTH} are allowed")
    # Only spaces and tabs separate fields; str.split() would also split on no-break spaces.
    parts = [p for p in text.replace("\t", " ").split(" ") if p]
    if len(parts) != 5:
        raise CronError(f"expected 5 fields (minute hour day month weekday), got {len(parts)}")
    return parts


@dataclass(frozen=True)
class DayRule:
    """Which days the day-of-month and day-of-week fields select together."""

    #: Plain days of month (1-31).
    days: frozenset[int]
    #: Plain weekdays, 0 = Sunday.
    weekdays: frozenset[int]
    #: POSIX: when both day fields are restricted, a day matches if either matches.
    day_or: bool
    #: ``L`` in day of month.
    last_day: bool = False
    #: ``LW`` in day of month.
    last_weekday: bool = False
    #: ``15W``: the day of month whose nearest weekday matches.
    nearest_weekday: int | None = None
    #: ``5L``: weekdays (0 = Sunday) matching on their last occurrence in the month.
    last_of_week: frozenset[int] = frozenset()
    #: ``1#2``: (weekday, n) matching the weekday's n-th occurrence in the month.
    nth_of_week: frozenset[tuple[int, int]] = frozenset()

    @property
    def special(self) -> bool:
        """Uses L, W or #: whether the rule can fire needs more than the month's days to know."""
        return bool(self.last_day or self.last_weekday or self.nearest_weekday or self.last_of_week or self.nth_of_week)

    def in_month(self, day: int, last: int, weekday: int) -> bool:
        """Day of month ``day`` of a month of ``last`` days, falling on ``weekday`` (0 = Sunday)."""
        if day in self.days or (self.last_day and day == last):
            return True
        if self.last_weekday and day == _weekday_near(last, last, (weekday + last - day) % 7):
            return True
        wanted = self.nearest_weekday
        return (
            wanted is not None and wanted <= last and day == _weekday_near(wanted, last, (weekday + wanted - day) % 7)
        )

    def in_week(self, day: int, last: int, weekday: int) -> bool:
        if weekday in self.weekdays or (weekday in self.last_of_week and day + 7 > last):
            return True
        return (weekday, (day + 6) // 7) in self.nth_of_week

    def matches(self, day: int, last: int, weekday: int) -> bool:
        if self.day_or:
            return self.in_month(day, last, weekday) or self.in_week(day, last, weekday)
        return self.in_month(day, last, weekday) and self.in_week(day, last, weekday)

    def occurs_in(self, months: tuple[int, ...]) -> bool:
        """Whether some day of these months matches. Within the 400-year Gregorian cycle each month
        (February with 28 and with 29 days) begins on every weekday, so trying each is exhaustive."""
        for month in months:
            for last in (28, 29) if month == 2 else (LONGEST_MONTH[month - 1],):
                for first in range(7):
                    if any(self.matches(day, last, (first + day - 1) % 7) for day in range(1, last + 1)):
                        return True
        return False


def _weekday_near(day: int, last: int, weekday: int) -> int:
    """The weekday nearest ``day`` (falling on ``weekday``) within its month of ``last`` days."""
    if weekday == _SATURDAY:
        return day - 1 if day > 1 else day + 2
    if weekday == _SUNDAY:
        return day + 1 if day < last else day - 2
    return day


def parse_days(dom: str, dow: str) -> DayRule:
    """The day rule of the day-of-month and day-of-week fields (``*`` in either ANDs them, as
    in Vixie cron: a field written starting with ``*``, even ``*/2``, is not "restricted")."""
    days, last_day, last_weekday, nearest = _month_days(dom)
    weekdays, last_of_week, nth = _week_days(dow)
    return DayRule(
        days=days,
        weekdays=weekdays,
        day_or=not dom.startswith("*") and not dow.startswith("*"),
        last_day=last_day,
        last_weekday=last_weekday,
        nearest_weekday=nearest,
        last_of_week=last_of_week,
        nth_of_week=nth,
    )


def _month_days(dom: str) -> tuple[frozenset[int], bool, bool, int | None]:
    days: set[int] = set()
    last_day = last_weekday = False
    nearest: int | None = None
    for part in _items(dom, DAY_OF_MONTH):
        upper = part.upper()
        if upper == "L":
            last_day = True
        elif upper == "LW":
            last_weekday = True
        elif upper.endswith("W"):
            if part != dom:
                raise CronError(f"day of month field: {part!r}: W takes one day alone, not in a list ({dom!r})")
            if not is_number(part[:-1]):
                raise CronError(f"day of month field: {part!r}: W follows one day of month (15W), not a range or step")
            nearest = _value(part[:-1], DAY_OF_MONTH)
        elif "L" in upper or "W" in upper:
            raise CronError(f"day of month field: {part!r}: L and W stand as L, LW or a day and W (15W)")
        else:
            days.update(_parse_part(part, DAY_OF_MONTH))
    return frozenset(days), last_day, last_weekday, nearest


def _week_days(dow: str) -> tuple[frozenset[int], frozenset[int], frozenset[tuple[int, int]]]:
    weekdays: set[int] = set()
    last_of_week: set[int] = set()
    nth: set[tuple[int, int]] = set()
    for part in _items(dow, DAY_OF_WEEK):
        upper = part.upper()
        if "#" in part:
            weekday_text, _, n_text = part.partition("#")
            if not is_number(n_text) or not 1 <= int(n_text) <= MAX_NTH:
                raise CronError(f"day of week field: {part!r}: the number after # must be 1 to {MAX_NTH}")
            nth.add((_single_weekday(weekday_text, part), int(n_text)))
        elif "L" in upper:
            if not upper.endswith("L") or not is_number(part[:-1]):
                raise CronError(f"day of week field: {part!r}: L follows one weekday number (5L, the last Friday)")
            last_of_week.add(_value(part[:-1], DAY_OF_WEEK) % 7)
        else:
            weekdays.update(d % 7 for d in _parse_part(part, DAY_OF_WEEK))
    return frozenset(weekdays), frozenset(last_of_week), frozenset(nth)


def _single_weekday(text: str, part: str) -> int:
    if not text or any(c in text.upper() for c in "-/*,L"):
        raise CronError(f"day of week field: {part!r}: # follows one weekday (1#2, the second Monday)")
    return _value(text, DAY_OF_WEEK) % 7
