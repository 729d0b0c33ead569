"""POSIX cron expressions evaluated in a time zone, with deliberate DST behaviour.

Rules (those of Vixie cron, which operators know):

* a wall-clock time that does not exist (spring forward) fires at the first valid instant after
  it, i.e. at the transition; several missing slots collapse into that one fire;
* a wall-clock time that happens twice (fall back) fires once, at its first occurrence, unless the
  hour field is ``*``: such "every hour" expressions follow real time and fire in both passes.

Everything here is pure: no I/O, no clock reads.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, tzinfo

_MONTHS = {
    m: i for i, m in enumerate(["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"], 1)
}
_DAYS = {d: i for i, d in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])}
#: Years searched for a matching day before an expression is declared impossible (e.g. 30 Feb).
_SEARCH_YEARS = 8
#: Largest UTC offset change of any zone's transition, bounding the DST look-around.
_MAX_SHIFT = timedelta(hours=3)


class CronError(ValueError):
    """Raised for an expression that is not a valid 5-field cron expression."""


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int
    names: dict[str, int] | None = None


_FIELDS = (
    _Field("minute", 0, 59),
    _Field("hour", 0, 23),
    _Field("day of month", 1, 31),
    _Field("month", 1, 12, _MONTHS),
    _Field("day of week", 0, 7, _DAYS),
)


def _value(text: str, field: _Field) -> int:
    if field.names and text.lower() in field.names:
        return field.names[text.lower()]
    if not text.isdigit():
        raise CronError(f"{field.name} field: {text!r} is not a number")
    value = int(text)
    if not field.low <= value <= field.high:
        raise CronError(f"{field.name} field: {value} is outside {field.low}-{field.high}")
    return value


def _parse_field(text: str, field: _Field) -> frozenset[int]:
    values: set[int] = set()
    for part in text.split(","):
        if not part:
            raise CronError(f"{field.name} field: empty list item in {text!r}")
        base, _, step_text = part.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or int(step_text) == 0:
                raise CronError(f"{field.name} field: step {step_text!r} must be a positive number")
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
            high = field.high if step_text else low
        values.update(range(low, high + 1, step))
    return frozenset(values)


@dataclass(frozen=True)
class CronExpression:
    """A parsed 5-field expression; :meth:`next_after` gives fire instants in a time zone."""

    text: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    #: POSIX: when both day fields are restricted, a day matches if either matches.
    day_or: bool
    every_hour: bool

    @classmethod
    def parse(cls, text: str) -> CronExpression:
        if not isinstance(text, str):
            raise CronError("must be a string")
        parts = text.split()
        if len(parts) != 5:
            raise CronError(f"expected 5 fields (minute hour day month weekday), got {len(parts)}")
        minute, hour, dom, month, dow = (_parse_field(p, f) for p, f in zip(parts, _FIELDS, strict=True))
        weekdays = frozenset(d % 7 for d in dow)
        return cls(
            text=" ".join(parts),
            minutes=tuple(sorted(minute)),
            hours=tuple(sorted(hour)),
            days=dom,
            months=month,
            weekdays=weekdays,
            day_or=not parts[2].startswith("*") and not parts[4].startswith("*"),
            every_hour=parts[1] == "*",
        )

    def _day_matches(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        in_month = day.day in self.days
        in_week = (day.isoweekday() % 7) in self.weekdays
        return (in_month or in_week) if self.day_or else (in_month and in_week)

    def _naive_times(self, start: datetime) -> Iterator[datetime]:
        """Wall-clock times matching the expression, from ``start`` (naive) onwards, in order."""
        day = start.date()
        for _ in range(366 * _SEARCH_YEARS):
            if self._day_matches(day):
                for hour in self.hours:
                    for minute in self.minutes:
                        candidate = datetime.combine(day, time(hour, minute))
                        if candidate >= start:
                            yield candidate
            day += timedelta(days=1)

    def _instants(self, naive: datetime, zone: tzinfo) -> list[datetime]:
        """The real instants a wall-clock time stands for, under the DST rules above."""
        first = naive.replace(tzinfo=zone, fold=0).astimezone(UTC)
        second = naive.replace(tzinfo=zone, fold=1).astimezone(UTC)
        if first == second:
            return [first]
        if first.astimezone(zone).replace(tzinfo=None) != naive:
            # A gap: ``second`` lies before the transition and ``first`` after it. The first valid
            # instant after the missing time is the transition itself.
            return [_transition_between(second, first, zone)]
        return [first, second] if self.every_hour else [first]

    def next_after(self, after: datetime, zone: tzinfo) -> datetime:
        """The first fire instant strictly after ``after`` (aware), as an aware UTC datetime."""
        if after.tzinfo is None:
            raise ValueError("after must be timezone-aware")
        local = after.astimezone(zone).replace(tzinfo=None, second=0, microsecond=0)
        best: datetime | None = None
        horizon: datetime | None = None
        # Start a little early: around a fall-back an earlier wall time can be a later instant.
        for naive in self._naive_times(local - _MAX_SHIFT):
            if horizon is not None and naive > horizon:
                break
            for instant in self._instants(naive, zone):
                if instant > after and (best is None or instant < best):
                    best = instant
                    horizon = naive + _MAX_SHIFT
        if best is None:
            raise CronError(f"{self.text!r} never fires")
        return best

    def upcoming(self, after: datetime, zone: tzinfo, count: int) -> list[datetime]:
        times: list[datetime] = []
        for _ in range(count):
            after = self.next_after(after, zone)
            times.append(after)
        return times


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
