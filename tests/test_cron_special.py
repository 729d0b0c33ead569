"""Cron's ``L``, ``W`` and ``#`` against cronsim, the peers' reference, as the oracle.

The "cronsim" tests below are cronsim 2.7's own cases for L, LW, #, and nL (tests/test_cronsim.py in
github.com/cuu508/cronsim: TestParse, TestValidation, TestIterator and TestReverse's samples),
transcribed: each says which of its cases it covers. cronsim has no ``15W``: that form follows
Quartz's meaning (the weekday nearest the day, within the month) and is checked by its rules.
cronsim's DST handling is Debian cron's, not ours, so in zones the fires are compared on days
without a transition only.
"""

from __future__ import annotations

import contextlib
from calendar import monthrange
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from itertools import islice
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim, CronSimError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celeryapp.domain.cron import CronExpression
from celeryapp.domain.cron_fields import CronError

NOW = datetime(2020, 1, 1, tzinfo=UTC)
RIGA = ZoneInfo("Europe/Riga")
LAST_FRIDAYS_2020: tuple[str, ...] = ("01-31", "02-28", "03-27", "04-24", "05-29", "06-26")
LAST_FRIDAYS_2020 += ("07-31", "08-28", "09-25", "10-30", "11-27", "12-25")


def ours(expr: str, after: datetime, zone: ZoneInfo | None = None, n: int = 1) -> list[datetime]:
    return CronExpression.parse(expr).upcoming(after, zone or UTC, n)  # type: ignore[arg-type]


def theirs(expr: str, after: datetime, n: int) -> list[datetime]:
    """cronsim's next ``n`` fires (fewer when it finds none within its 50-year horizon)."""
    it: Iterator[datetime] = CronSim(expr, after)
    return list(islice(it, n))


# cronsim TestIterator: test_it_handles_l, _lw, _last_friday (12 fires), _last_sunday_two_notations
# (2 patterns), _nth_weekday.
@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("1 1 L * *", ["2020-01-31T01:01:00"]),
        ("1 1 LW 5 *", ["2020-05-29T01:01:00"]),
        (
            "1 1 * * 5L",
            [f"2020-{md}T01:01:00" for md in LAST_FRIDAYS_2020],
        ),
        ("1 1 * * 0L", ["2020-01-26T01:01:00"]),
        ("1 1 * * 7L", ["2020-01-26T01:01:00"]),
        ("1 1 * * 1#2", ["2020-01-13T01:01:00"]),
    ],
)
def test_cronsim_iterator_cases(expr: str, expected: list[str]) -> None:
    got = ours(expr, NOW, n=len(expected))
    assert [t.replace(tzinfo=None).isoformat() for t in got] == expected


# cronsim TestParse: test_it_parses_day_l, _day_lw, _day_lowercase_l, _day_lowercase_lw,
# _nth_weekday, _it_handles_a_mix_of_ints_and_tuples, _accepts_weekday_l: the meaning of each parse.
@pytest.mark.parametrize(
    ("expr", "same_as"),
    [
        ("0 0 l * *", "0 0 L * *"),
        ("0 0 lw * *", "0 0 LW * *"),
        ("0 0 * * 1,2,3#1", "0 0 * * 3#1,1,2"),
        ("0 0 * * mon#2", "0 0 * * 1#2"),
        ("0 0 * * 5l", "0 0 * * 5L"),
    ],
)
def test_cronsim_parse_cases_mean_the_same(expr: str, same_as: str) -> None:
    assert ours(expr, NOW, n=30) == ours(same_as, NOW, n=30)
    assert ours(expr, NOW, n=30) == theirs(expr, NOW, 30)


def test_cronsim_parse_cases_fields() -> None:
    assert CronExpression.parse("* * L * *").rule.last_day
    assert CronExpression.parse("* * LW * *").rule.last_weekday
    assert CronExpression.parse("* * * * 1#2").rule.nth_of_week == {(1, 2)}
    mixed = CronExpression.parse("* * * * 1,2,3#1").rule
    assert (mixed.weekdays, mixed.nth_of_week) == (frozenset({1, 2}), frozenset({(3, 1)}))
    assert CronExpression.parse("* * * * 5L").rule.last_of_week == {5}


# cronsim TestValidation: test_it_rejects_bad_values' L/W/# values (2#, #2, 1##1, LL, LWX) in every
# field, _rejects_zero_nth, _big_nth, _dow_l_range, _dow_l_hash, _dow_l_slash, _symbolic_dow_l; and
# the plan's hostile ones. Each error names its field.
@pytest.mark.parametrize(
    ("expr", "reason"),
    [
        *[
            (pattern % bad, "field")
            for bad in ("2#", "#2", "1##1", "LL", "LWX")
            for pattern in ("%s * * * *", "* %s * * *", "* * %s * *", "* * * %s *", "* * * * %s", "* * 1,%s * *")
        ],
        ("* * * * 1#0", "day of week field: '1#0': the number after # must be 1 to 5"),
        ("* * * * 1#6", "day of week field: '1#6': the number after # must be 1 to 5"),
        ("* * * * 5L-6", "day of week field: '5L-6': L follows one weekday number"),
        ("* * * * 5L#1", "day of week field: '5L#1': # follows one weekday"),
        ("* * * * 5L/3", "day of week field: '5L/3': L follows one weekday number"),
        ("* * * * MONL", "day of week field: 'MONL': L follows one weekday number"),
        ("0 0 0L * *", "day of month field: '0L'"),
        ("0 0 32W * *", "day of month field: 32 is outside 1-31"),
        ("0 0 * * 8#1", "day of week field: 8 is outside 0-7"),
        ("0 0 * * 1-5#2", "day of week field: '1-5#2': # follows one weekday"),
        ("0 0 * L * *", "expected 5 fields"),
        ("0 0 * L *", "month field: 'L' is not a number or a name \\(L, W and # mean"),
        ("L 0 * * *", "minute field: 'L' is not a number"),
        ("0 15W * * *", "hour field: '15W' is not a number"),
        ("0 0 * 1#2 *", "month field: '1#2'"),
        ("0 0 * * L", "day of week field: 'L': L follows one weekday number"),
        ("0 0 * * LW", "day of week field: 'LW'"),
        ("0 0 * * 15W", "day of week field: '15W'"),
        ("0 0 1#2 * *", "day of month field: '1#2'"),
        ("0 0 1-5W * *", "day of month field: '1-5W': W follows one day of month"),
        ("0 0 */2W * *", "day of month field: '\\*/2W'"),
        ("0 0 1,15W * *", "day of month field: '15W': W takes one day alone"),
        ("0 0 W * *", "day of month field: 'W'"),
        ("0 0 L-3 * *", "day of month field: 'L-3'"),  # cronsim has no L-n
        ("0 0 L/2 * *", "day of month field: 'L/2'"),  # cronsim reads it as L: we refuse the noise
        ("0 0 LW/2 * *", "day of month field: 'LW/2'"),
    ],
)
def test_malformed_special_forms_are_refused_naming_the_field(expr: str, reason: str) -> None:
    with pytest.raises(CronError, match=reason):
        CronExpression.parse(expr)


@pytest.mark.parametrize(
    ("expr", "words"),
    [
        # cronsim TestIterator.test_it_handles_no_matches, "1 1 */100 * MON#4" (our steps stop at 31).
        ("1 1 */31 * MON#4", "day of month field '\\*/31' with day of week field 'MON#4' never occurs"),
        ("0 0 LW * */6", "never occurs"),  # the last weekday is never a Saturday or Sunday
        ("0 0 30W 2 *", "day of month field '30W' with day of week field '\\*' never occurs in month field '2'"),
        ("0 0 31W 4,6,9,11 *", "never occurs"),
        ("0 0 L * 1#1", None),  # an OR: first Mondays
        ("0 0 * 2 1#5", None),  # 29 February on a Monday: 2044
        ("0 0 29W 2 *", None),  # leap years only
    ],
)
def test_an_expression_that_can_never_fire_is_refused(expr: str, words: str | None) -> None:
    if words is None:
        fire = ours(expr, NOW)[0]
        assert fire == theirs(expr, NOW, 1)[0] if "W" not in expr.split()[2] else fire.month == 2
        return
    with pytest.raises(CronError, match=words):
        CronExpression.parse(expr)
    if "W" not in expr.split()[2] or expr.split()[2] == "LW":
        assert theirs(expr.replace("*/31", "*/100"), NOW, 1) == []  # cronsim finds nothing in 50 years


def test_every_month_starts_on_every_weekday_within_the_gregorian_cycle() -> None:
    # DayRule.occurs_in decides "can never fire" by trying each month length and first weekday.
    seen = {(m, monthrange(y, m)[1], date(y, m, 1).isoweekday() % 7) for y in range(2000, 2400) for m in range(1, 13)}
    assert len(seen) == (12 + 1) * 7


# cronsim TestReverse.samples with L, LW, 5L, 0L, 7L, 1#2: their forward fires, in UTC and in
# Europe/Riga around its 2021 transitions (compared on days without one).
@pytest.mark.parametrize("expr", ["1 1 L * *", "1 1 LW 5 *", "1 1 * * 5L", "1 1 * * 0L", "1 1 * * 7L", "1 1 * * 1#2"])
@pytest.mark.parametrize(
    "start", [NOW, datetime(2021, 3, 28, 1, 30, tzinfo=RIGA), datetime(2021, 10, 31, 1, 30, tzinfo=RIGA)]
)
def test_cronsim_reverse_samples_forward(expr: str, start: datetime) -> None:
    zone = start.tzinfo
    assert isinstance(zone, ZoneInfo) or zone is UTC
    expected = [t for t in theirs(expr, start, 5) if not _transition_day(t)]
    got = [t for t in ours(expr, start.astimezone(UTC), zone, 5) if not _transition_day(t.astimezone(zone))]  # type: ignore[arg-type]
    assert got == expected


def _transition_day(t: datetime) -> bool:
    day = t.replace(hour=0, minute=0, second=0, tzinfo=None)
    zone = t.tzinfo
    start = day.replace(tzinfo=zone).utcoffset()
    end = (day + timedelta(days=1)).replace(tzinfo=zone).utcoffset()
    return start != end


DOM = st.sampled_from(["*", "L", "LW", "15", "1", "31", "L,15", "LW,1", "*/2", "1-7", "29", "L,1-3"])
DOW = st.one_of(
    st.sampled_from(["*", "1-5", "*/2", "0", "mon", "fri#2", "sun#5"]),
    st.builds(lambda d: f"{d}L", st.integers(0, 7)),
    st.builds(lambda d, n: f"{d}#{n}", st.integers(0, 7), st.integers(1, 5)),
    st.builds(lambda d, n, e: f"{d}#{n},{e}", st.integers(0, 6), st.integers(1, 5), st.integers(0, 7)),
    st.builds(lambda a, b: f"{a}L,{b}L", st.integers(0, 7), st.integers(0, 7)),
)
MONTH = st.sampled_from(["*", "2", "1-6", "*/3", "2,4", "dec"])
TIME = st.sampled_from(["0 0", "30 18", "*/20 9", "0 */6", "59 23"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    time_of_day=TIME,
    dom=DOM,
    month=MONTH,
    dow=DOW,
    after=st.datetimes(datetime(1990, 1, 1), datetime(2060, 1, 1)).map(lambda t: t.replace(tzinfo=UTC)),
)
def test_random_expressions_fire_when_cronsim_says_in_utc(
    time_of_day: str, dom: str, month: str, dow: str, after: datetime
) -> None:
    expr = f"{time_of_day} {dom} {month} {dow}"
    try:
        parsed = CronExpression.parse(expr)
    except CronError as exc:
        assert "never occurs" in str(exc)
        with contextlib.suppress(CronSimError):  # cronsim refuses some dead expressions itself
            assert theirs(expr, after, 1) == []
        return
    expected = theirs(expr, after, 20)  # up to cronsim's horizon: 50 years without a fire
    assert expected, expr
    assert parsed.upcoming(after, UTC, len(expected)) == expected


@settings(max_examples=100, deadline=None)
@given(
    dom=DOM,
    dow=DOW,
    zone=st.sampled_from(["Europe/London", "America/New_York", "Australia/Sydney", "Asia/Kolkata"]),
    after=st.datetimes(datetime(2000, 1, 1), datetime(2040, 1, 1)),
)
def test_random_expressions_agree_with_cronsim_in_zones_off_transition_days(
    dom: str, dow: str, zone: str, after: datetime
) -> None:
    expr, tz = f"30 2 {dom} * {dow}", ZoneInfo(zone)
    try:
        CronExpression.parse(expr)
    except CronError:
        return
    start = after.replace(tzinfo=tz)
    expected = [t for t in theirs(expr, start, 20) if not _transition_day(t)]
    got = [t.astimezone(tz) for t in ours(expr, start.astimezone(UTC), tz, 20)]
    got = [t for t in got if not _transition_day(t)]
    assert got == expected


# 15W (Quartz's meaning; cronsim has none).
@pytest.mark.parametrize(
    ("expr", "after", "expected"),
    [
        ("0 9 15W * *", "2026-08-01", "2026-08-14"),  # the 15th is a Saturday: Friday 14th
        ("0 9 15W * *", "2026-03-01", "2026-03-16"),  # a Sunday: Monday 16th
        ("0 9 15W * *", "2026-04-01", "2026-04-15"),  # a Wednesday: the day itself
        ("0 9 1W * *", "2026-07-31", "2026-08-03"),  # 1 August is a Saturday: Monday 3rd, not 31 July
        ("0 9 31W * *", "2026-05-01", "2026-05-29"),  # 31 May is a Sunday: Friday 29th, not 1 June
        ("0 9 31W * *", "2026-06-01", "2026-07-31"),  # June has no 31st: nothing in June
        ("0 9 29W 2 *", "2026-01-01", "2028-02-29"),  # only in leap years
    ],
)
def test_nearest_weekday_stays_in_the_month(expr: str, after: str, expected: str) -> None:
    fire = ours(expr, datetime.fromisoformat(after).replace(tzinfo=UTC))[0]
    assert fire.date().isoformat() == expected


@given(day=st.integers(1, 31), after=st.dates(date(2000, 1, 1), date(2399, 1, 1)))
def test_nearest_weekday_is_a_weekday_of_the_same_month_within_two_days(day: int, after: date) -> None:
    fire = ours(f"0 0 {day}W * *", datetime.combine(after, datetime.min.time(), UTC))[0].date()
    assert fire.isoweekday() <= 5
    assert abs(fire.day - day) <= 2
    assert day <= monthrange(fire.year, fire.month)[1]
    if date(fire.year, fire.month, day).isoweekday() <= 5:
        assert fire.day == day


LONDON = ZoneInfo("Europe/London")


def test_our_dst_rule_holds_on_special_days_that_are_transition_days() -> None:
    # 31 March 2024, the last day of March, is London's spring-forward day: 01:30 does not exist,
    # so it fires at the transition (cronsim, like Debian cron, would differ: compared off those days).
    assert [t.astimezone(LONDON).isoformat() for t in ours("30 1 L 3 *", NOW, LONDON, 2)] == [
        "2020-03-31T01:30:00+01:00",
        "2021-03-31T01:30:00+01:00",
    ]
    spring = ours("30 1 L 3 *", datetime(2024, 3, 1, tzinfo=UTC), LONDON)[0]
    assert spring.astimezone(LONDON).isoformat() == "2024-03-31T02:00:00+01:00"
    # The last Sunday of October is the fall-back day: a fixed 01:30 fires once, in the first pass.
    fall = ours("30 1 * 10 0L", datetime(2026, 10, 1, tzinfo=UTC), LONDON, 2)
    assert [t.astimezone(LONDON).isoformat() for t in fall] == [
        "2026-10-25T01:30:00+01:00",
        "2027-10-31T01:30:00+01:00",  # 31 October 2027 is the last Sunday too
    ]


def test_a_definition_names_the_cron_field_and_its_part() -> None:
    from celeryapp.domain.validation import parse_definition

    steps = [{"name": "a", "task": "t"}]
    assert parse_definition({"name": "x", "cron": "0 18 lw * *", "steps": steps}).cron == "0 18 lw * *"
    for expr, words in (
        ("0 0 * * 1#6", "cron: day of week field: '1#6': the number after # must be 1 to 5"),
        ("0 0 LW * */6", "cron: day of month field 'LW' with day of week field '\\*/6' never occurs"),
    ):
        with pytest.raises(ValueError, match=words):
            parse_definition({"name": "x", "cron": expr, "steps": steps})
