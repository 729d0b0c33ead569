"""POSIX cron expressions evaluated in a time zone, with deliberate DST behaviour.

Our DST rule (our own, not Vixie cron's; see docs/schedules.md "Cron and DST"):

* a wall-clock time that does not exist (spring forward) fires at the first valid instant after
  it, i.e. at the transition; several missing slots collapse into that one fire;
* a wall-clock time that happens twice (fall back) fires once, at its first occurrence, unless the
  hour field starts with ``*`` (``*``, ``*/2``): such hourly patterns follow the clock through
  both passes.

A schedule's ``dst`` (:class:`celeryapp.domain.dst_rules.DstRules`) replaces either rule for every
pattern: ``repeated`` fires the first, the last or both passes, ``missing: skip`` does not fire a
time that does not exist.

An accepted expression fires forever: one whose days can never occur (30 February, ``30W`` in
February, ``LW`` on Saturdays) is refused when parsed, and the Gregorian calendar, weekdays
included, repeats every 400 years, so any day that can match once matches again. The fields,
``L``, ``W`` and ``#`` included, are read in :mod:`celeryapp.domain.cron_fields`.

Everything here is pure: no I/O, no clock reads.
"""

from __future__ import annotations

from calendar import monthrange
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import MAXYEAR, UTC, date, datetime, time, timedelta, tzinfo
from functools import lru_cache

from celeryapp.domain.cron_fields import (
    FIELDS,
    LONGEST_MONTH,
    CronError,
    DayRule,
    parse_days,
    parse_field,
    split,
)
from celeryapp.domain.dst_rules import DEFAULT, DstRules, transition_between


@dataclass(frozen=True)
class CronExpression:
    """A parsed 5-field expression; :meth:`next_after` gives fire instants in a time zone."""

    text: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    months: tuple[int, ...]
    #: Which days the two day fields select (L, W and # included).
    rule: DayRule
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
        parts = split(text)
        minute, hour, month = (parse_field(parts[i], FIELDS[i]) for i in (0, 1, 3))
        rule = parse_days(parts[2], parts[4])
        months = tuple(sorted(month))
        if (
            not rule.special
            and not rule.day_or
            and not any(d <= LONGEST_MONTH[m - 1] for m in months for d in rule.days)
        ):
            # With the weekday ANDed in, every existing date still falls on each weekday within
            # 400 years; only a date that never exists makes the expression dead.
            raise CronError(f"day of month field: {parts[2]!r} never occurs in month field {parts[3]!r}")
        if rule.special and not rule.occurs_in(months):
            raise CronError(
                f"day of month field {parts[2]!r} with day of week field {parts[4]!r} never occurs"
                f" in month field {parts[3]!r}"
            )
        return cls(
            text=" ".join(parts),
            minutes=tuple(sorted(minute)),
            hours=tuple(sorted(hour)),
            months=months,
            rule=rule,
            every_hour=parts[1].startswith("*"),
        )

    @property
    def days(self) -> frozenset[int]:
        """The plain days of month (without L and W)."""
        return self.rule.days

    @property
    def weekdays(self) -> frozenset[int]:
        """The plain weekdays, 0 = Sunday (without L and #)."""
        return self.rule.weekdays

    @property
    def day_or(self) -> bool:
        return self.rule.day_or

    def _days(self, start: date) -> Iterator[date]:
        """Matching days from ``start`` onwards, in order; months outside the month field are skipped."""
        for year in range(start.year, MAXYEAR + 1):
            for month in self.months:
                if (year, month) < (start.year, start.month):
                    continue
                first = start.day if (year, month) == (start.year, start.month) else 1
                last = monthrange(year, month)[1]
                weekday_of_first = date(year, month, 1).isoweekday() % 7
                for day in range(first, last + 1):
                    if self.rule.matches(day, last, (weekday_of_first + day - 1) % 7):
                        yield date(year, month, day)

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

    def wall_times(self, start: datetime, end: datetime) -> list[datetime]:
        """The naive wall times matching the expression in [start, end): meant for the stretch a
        change of the clocks skips or repeats, a few hours at most."""
        times = []
        for naive in self._naive_times(start):
            if naive >= end:
                break
            times.append(naive)
        return times

    def _first_after(self, after: datetime, zone: tzinfo, start: datetime, fold: int, skip: bool) -> datetime:
        # With ``fold`` fixed, the instant never decreases as wall time grows, so the first
        # wall time whose instant is after ``after`` gives the earliest such instant.
        for naive in self._naive_times(start):
            instant = instant_of(naive, zone, fold, skip)
            if instant is not None and instant > after:
                return instant
        raise CronError(f"{self.text!r} has no fire time before the year {MAXYEAR + 1}")

    def next_after(self, after: datetime, zone: tzinfo, dst: DstRules | None = None) -> datetime:
        """The first fire instant strictly after ``after`` (aware), as an aware UTC datetime,
        by the schedule's ``dst`` rule (``None``: the default one).

        Never fails for a parsed expression unless the next fire lies beyond year 9999.
        """
        if after.tzinfo is None:
            raise ValueError("after must be timezone-aware")
        rules = dst or DEFAULT
        wall = after.astimezone(zone)
        start = wall.replace(tzinfo=None, second=0, microsecond=0)
        best: datetime | None = None
        for fold in rules.folds(self.every_hour):
            rewind = timedelta(0)
            if fold == 1 and wall.fold == 0:
                # In the first pass of a repeated hour, wall times already passed fire again in
                # the second pass: search the second passes from the start of the repeated stretch.
                offset, offset_later = wall.utcoffset(), wall.replace(fold=1).utcoffset()
                assert offset is not None and offset_later is not None
                rewind = max(offset - offset_later, timedelta(0))
            found = self._first_after(after, zone, start - rewind, fold, rules.skips_missing)
            best = found if best is None else min(best, found)
        assert best is not None  # every rule fires in at least one pass
        return best

    def upcoming(self, after: datetime, zone: tzinfo, count: int, dst: DstRules | None = None) -> list[datetime]:
        times: list[datetime] = []
        for _ in range(count):
            after = self.next_after(after, zone, dst)
            times.append(after)
        return times


def instant_of(naive: datetime, zone: tzinfo, fold: int = 0, skip: bool = False) -> datetime | None:
    """The real instant of a wall-clock time; ``fold`` picks the pass of a repeated time. A time
    that does not exist is the transition after it, or ``None`` with ``skip``."""
    first = naive.replace(tzinfo=zone, fold=0).astimezone(UTC)
    second = naive.replace(tzinfo=zone, fold=1).astimezone(UTC)
    if first == second:
        return first
    if first.astimezone(zone).replace(tzinfo=None) != naive:
        # A gap: ``second`` lies before the transition and ``first`` after it. The first valid
        # instant after the missing time is the transition itself.
        return None if skip else transition_between(second, first, zone)
    return second if fold else first


#: Distinct expressions kept parsed; each is at most ``cron_fields.MAX_LENGTH`` characters (an invalid one is
#: never kept: its error is raised again each time).
PARSED_CACHE_SIZE = 4096


@lru_cache(maxsize=PARSED_CACHE_SIZE)
def _parse(text: str) -> CronExpression:
    return CronExpression._parse_uncached(text)
