"""POSIX cron expressions evaluated in a time zone, with deliberate DST behaviour.

Our DST rule (our own, not Vixie cron's; see docs/schedules.md "Cron and DST"):

* a wall-clock time that does not exist (spring forward) fires at the first valid instant after
  it, i.e. at the transition; several missing slots collapse into that one fire;
* a wall-clock time that happens twice (fall back) fires once, at its first occurrence, unless the
  hour field starts with ``*`` (``*``, ``*/2``): such hourly patterns follow the clock through
  both passes.

An accepted expression fires forever: one whose days can never occur (30 February) is refused when
parsed, and the Gregorian calendar, weekdays included, repeats every 400 years, so any day that
can match once matches again.

Everything here is pure: no I/O, no clock reads.
"""

from __future__ import annotations

from calendar import monthrange
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import MAXYEAR, UTC, date, datetime, time, timedelta, tzinfo
from functools import lru_cache

from celeryapp.errors import ChordbeatError

#: Longest accepted expression; anything longer is not a hand-written schedule.
MAX_LENGTH = 200
_MONTHS = {
    m: i for i, m in enumerate(["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"], 1)
}
_DAYS = {d: i for i, d in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])}
#: Days in each month of a leap year: a day of month beyond these never occurs.
_LONGEST_MONTH = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


class CronError(ChordbeatError, ValueError):
    """Raised for an expression that is not a valid 5-field cron expression."""


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int
    #: Largest step: the number of distinct values (``*/60`` is minute 0, ``*/61`` a mistake).
    max_step: int
    names: dict[str, int] | None = None


_FIELDS = (
    _Field("minute", 0, 59, 60),
    _Field("hour", 0, 23, 24),
    _Field("day of month", 1, 31, 31),
    _Field("month", 1, 12, 12, _MONTHS),
    _Field("day of week", 0, 7, 7, _DAYS),
)


def is_number(text: str) -> bool:
    """A cron field's number: ASCII digits only (str.isdigit alone accepts '¹' and '٣')."""
    return text.isascii() and text.isdigit()


def _value(text: str, field: _Field) -> int:
    if field.names and text.isascii() and text.lower() in field.names:
        return field.names[text.lower()]
    if not is_number(text):
        kind = "a number or a name" if field.names else "a number"
        raise CronError(f"{field.name} field: {text!r} is not {kind}")
    value = int(text)
    if not field.low <= value <= field.high:
        raise CronError(f"{field.name} field: {value} is outside {field.low}-{field.high}")
    return value


def _parse_part(part: str, field: _Field) -> range:
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


def _parse_field(text: str, field: _Field) -> frozenset[int]:
    values: set[int] = set()
    for part in text.split(","):
        if not part:
            raise CronError(f"{field.name} field: empty list item in {text!r}")
        values.update(_parse_part(part, field))
    return frozenset(values)


def _split(text: str) -> list[str]:
    if len(text) > MAX_LENGTH:
        raise CronError(f"is {len(text)} characters long, at most {MAX_LENGTH} are allowed")
    # Only spaces and tabs separate fields; str.split() would also split on no-break spaces.
    parts = [p for p in text.replace("\t", " ").split(" ") if p]
    if len(parts) != 5:
        raise CronError(f"expected 5 fields (minute hour day month weekday), got {len(parts)}")
    return parts


@dataclass(frozen=True)
class CronExpression:
    """A parsed 5-field expression; :meth:`next_after` gives fire instants in a time zone."""

    text: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: tuple[int, ...]
    weekdays: frozenset[int]
    #: POSIX: when both day fields are restricted, a day matches if either matches.
    day_or: bool
    #: Hour field written with a leading ``*``: fires in both passes of a repeated hour.
    every_hour: bool

    @classmethod
    def parse(cls, text: str) -> CronExpression:
        """The expression ``text`` stands for, parsed once per distinct text: beat, firing and
        the stores ask for the same few expressions over and over."""
        if not isinstance(text, str):
            raise CronError("must be a string")
        return _parse(text)

    @classmethod
    def _parse_uncached(cls, text: str) -> CronExpression:
        parts = _split(text)
        minute, hour, dom, month, dow = (_parse_field(p, f) for p, f in zip(parts, _FIELDS, strict=True))
        # As in Vixie cron, a day field written starting with '*' (even `*/2`) is not "restricted".
        day_or = not parts[2].startswith("*") and not parts[4].startswith("*")
        if not day_or and not any(d <= _LONGEST_MONTH[m - 1] for m in month for d in dom):
            # With the weekday ANDed in, every existing date still falls on each weekday within
            # 400 years; only a date that never exists makes the expression dead.
            raise CronError(f"day of month field: {parts[2]!r} never occurs in month field {parts[3]!r}")
        return cls(
            text=" ".join(parts),
            minutes=tuple(sorted(minute)),
            hours=tuple(sorted(hour)),
            days=dom,
            months=tuple(sorted(month)),
            weekdays=frozenset(d % 7 for d in dow),
            day_or=day_or,
            every_hour=parts[1].startswith("*"),
        )

    def _days(self, start: date) -> Iterator[date]:
        """Matching days from ``start`` onwards, in order; months outside the month field are skipped."""
        for year in range(start.year, MAXYEAR + 1):
            for month in self.months:
                if (year, month) < (start.year, start.month):
                    continue
                first = start.day if (year, month) == (start.year, start.month) else 1
                last = monthrange(year, month)[1]
                for day in range(first, last + 1):
                    candidate = date(year, month, day)
                    in_month = day in self.days
                    in_week = candidate.isoweekday() % 7 in self.weekdays
                    if (in_month or in_week) if self.day_or else (in_month and in_week):
                        yield candidate

    def _naive_times(self, start: datetime) -> Iterator[datetime]:
        """Wall-clock times matching the expression, from ``start`` (naive) onwards, in order."""
        for day in self._days(start.date()):
            for hour in self.hours:
                if day == start.date() and hour < start.hour:
                    continue
                for minute in self.minutes:
                    candidate = datetime.combine(day, time(hour, minute))
                    if candidate >= start:
                        yield candidate

    def _first_after(self, after: datetime, zone: tzinfo, start: datetime, fold: int) -> datetime:
        # With ``fold`` fixed, the instant never decreases as wall time grows, so the first
        # wall time whose instant is after ``after`` gives the earliest such instant.
        for naive in self._naive_times(start):
            instant = _instant(naive, zone, fold)
            if instant > after:
                return instant
        raise CronError(f"{self.text!r} has no fire time before the year {MAXYEAR + 1}")

    def next_after(self, after: datetime, zone: tzinfo) -> datetime:
        """The first fire instant strictly after ``after`` (aware), as an aware UTC datetime.

        Never fails for a parsed expression unless the next fire lies beyond year 9999.
        """
        if after.tzinfo is None:
            raise ValueError("after must be timezone-aware")
        wall = after.astimezone(zone)
        start = wall.replace(tzinfo=None, second=0, microsecond=0)
        best = self._first_after(after, zone, start, fold=0)
        if self.every_hour:
            # In the first pass of a repeated hour, wall times already passed fire again in the
            # second pass: search the second passes from the start of the repeated stretch.
            offset, offset_later = wall.utcoffset(), wall.replace(fold=1).utcoffset()
            assert offset is not None and offset_later is not None
            rewind = max(offset - offset_later, timedelta(0)) if wall.fold == 0 else timedelta(0)
            best = min(best, self._first_after(after, zone, start - rewind, fold=1))
        return best

    def upcoming(self, after: datetime, zone: tzinfo, count: int) -> list[datetime]:
        times: list[datetime] = []
        for _ in range(count):
            after = self.next_after(after, zone)
            times.append(after)
        return times


def _instant(naive: datetime, zone: tzinfo, fold: int) -> datetime:
    """The real instant of a wall-clock time; ``fold`` picks the pass of a repeated time."""
    first = naive.replace(tzinfo=zone, fold=0).astimezone(UTC)
    second = naive.replace(tzinfo=zone, fold=1).astimezone(UTC)
    if first == second:
        return first
    if first.astimezone(zone).replace(tzinfo=None) != naive:
        # A gap: ``second`` lies before the transition and ``first`` after it. The first valid
        # instant after the missing time is the transition itself.
        return _transition_between(second, first, zone)
    return second if fold else first


def _transition_between(before: datetime, after: datetime, zone: tzinfo) -> datetime:
    """First whole second in (before, after] whose UTC offset is the later one."""
    target = after.astimezone(zone).utcoffset()
    low, high = before, after
    while high - low > timedelta(seconds=1):
        mid = low + (high - low) / 2
        mid = mid.replace(microsecond=0)
        if mid <= low:
            break
        if mid.astimezone(zone).utcoffset() == target:
            high = mid
        else:
            low = mid
    return high


#: Distinct expressions kept parsed; each is at most ``MAX_LENGTH`` characters (an invalid one is
#: never kept: its error is raised again each time).
PARSED_CACHE_SIZE = 4096


@lru_cache(maxsize=PARSED_CACHE_SIZE)
def _parse(text: str) -> CronExpression:
    return CronExpression._parse_uncached(text)
