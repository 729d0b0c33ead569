"""Cron expressions and DST, with computed times (no waiting)."""

from __future__ import annotations

import random
from calendar import monthrange
from datetime import UTC, datetime, time, timedelta
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest

from celeryapp.domain.cron import CronExpression
from celeryapp.domain.cron_fields import CronError

LONDON = ZoneInfo("Europe/London")
NEW_YORK = ZoneInfo("America/New_York")
BERLIN = ZoneInfo("Europe/Berlin")
LORD_HOWE = ZoneInfo("Australia/Lord_Howe")
APIA = ZoneInfo("Pacific/Apia")


def at(text: str, zone: ZoneInfo = UTC) -> datetime:  # type: ignore[assignment]
    return datetime.fromisoformat(text).replace(tzinfo=zone)


def upcoming(expr: str, after: datetime, zone: ZoneInfo, n: int) -> list[str]:
    return [t.astimezone(zone).isoformat() for t in CronExpression.parse(expr).upcoming(after, zone, n)]


def test_daily_time_follows_the_zone_across_a_dst_change() -> None:
    assert upcoming("0 2 * * *", at("2026-03-27T12:00"), LONDON, 3) == [
        "2026-03-28T02:00:00+00:00",
        "2026-03-29T02:00:00+01:00",
        "2026-03-30T02:00:00+01:00",
    ]
    assert upcoming("0 2 * * *", at("2026-03-07T12:00"), NEW_YORK, 3) == [
        "2026-03-08T03:00:00-04:00",  # 02:00 does not exist that day: the first valid instant after it
        "2026-03-09T02:00:00-04:00",
        "2026-03-10T02:00:00-04:00",
    ]


def test_missing_wall_time_fires_at_the_transition() -> None:
    assert upcoming("30 1 * * *", at("2026-03-28T12:00"), LONDON, 2) == [
        "2026-03-29T02:00:00+01:00",
        "2026-03-30T01:30:00+01:00",
    ]
    assert upcoming("30 2 * * *", at("2026-03-07T12:00"), NEW_YORK, 2) == [
        "2026-03-08T03:00:00-04:00",
        "2026-03-09T02:30:00-04:00",
    ]


def test_several_missing_slots_collapse_into_one_fire() -> None:
    assert upcoming("*/20 1 * * *", at("2026-03-29T00:00"), LONDON, 2) == [
        "2026-03-29T02:00:00+01:00",
        "2026-03-30T01:00:00+01:00",
    ]


def test_repeated_wall_time_fires_once() -> None:
    times = CronExpression.parse("30 1 * * *").upcoming(at("2026-10-24T12:00"), LONDON, 2)
    assert [t.isoformat() for t in times] == ["2026-10-25T00:30:00+00:00", "2026-10-26T01:30:00+00:00"]


def test_every_hour_expressions_follow_real_time_through_the_repeated_hour() -> None:
    assert upcoming("15 * * * *", at("2026-10-24T23:30"), LONDON, 4) == [
        "2026-10-25T01:15:00+01:00",
        "2026-10-25T01:15:00+00:00",
        "2026-10-25T02:15:00+00:00",
        "2026-10-25T03:15:00+00:00",
    ]


@pytest.mark.parametrize(
    ("expr", "after", "expected"),
    [
        ("*/15 * * * *", "2026-01-01T00:07", "2026-01-01T00:15:00+00:00"),
        ("0 0 1 jan *", "2026-06-01T00:00", "2027-01-01T00:00:00+00:00"),
        ("0 9 * * mon-fri", "2026-11-21T10:00", "2026-11-23T09:00:00+00:00"),  # Saturday → Monday
        ("0 0 13 * 5", "2026-10-01T00:00", "2026-10-02T00:00:00+00:00"),  # day-of-month OR weekday
        ("0 0 29 2 *", "2026-03-01T00:00", "2028-02-29T00:00:00+00:00"),
        ("59 23 31 12 7", "2026-12-31T23:59", "2027-12-05T23:59:00+00:00"),  # 7 is Sunday, only in December
        ("0 12 * * *", "2026-01-01T12:00", "2026-01-02T12:00:00+00:00"),  # strictly after
    ],
)
def test_next_fire_time(expr: str, after: str, expected: str) -> None:
    assert CronExpression.parse(expr).next_after(at(after), UTC).isoformat() == expected


@pytest.mark.parametrize(
    ("expr", "reason"),
    [
        ("* * * *", "expected 5 fields"),
        ("60 * * * *", "minute field: 60 is outside 0-59"),
        ("* 24 * * *", "hour field: 24 is outside 0-23"),
        ("* * 0 * *", "day of month field: 0 is outside 1-31"),
        ("* * * 13 *", "month field: 13 is outside 1-12"),
        ("*/0 * * * *", "minute field: step '0' must be a number from 1 to 60"),
        ("5-1 * * * *", "runs backwards"),
        ("a * * * *", "is not a number"),
        ("1,,2 * * * *", "empty list item"),
        ("@daily", "expected 5 fields"),
    ],
)
def test_invalid_expressions_say_why(expr: str, reason: str) -> None:
    with pytest.raises(CronError, match=reason):
        CronExpression.parse(expr)


@pytest.mark.parametrize(
    ("expr", "reason"),
    [
        ("2/ * * * *", "minute field: step '' must be a number from 1 to 60"),
        ("0-10/ * * * *", "minute field: step '' must be a number"),
        ("*/ * * * *", "minute field: step '' must be a number"),
        ("/5 * * * *", "minute field: '/5' has nothing before '/'"),
        ("*/61 * * * *", "minute field: step '61' must be a number from 1 to 60"),
        ("0 */25 * * *", "hour field: step '25' must be a number from 1 to 24"),
        ("0 0 * * */8", "day of week field: step '8' must be a number from 1 to 7"),
        ("\u00b9 * * * *", "minute field: '\u00b9' is not a number"),
        ("\u0663 * * * *", "minute field: '\u0663' is not a number"),
        ("*/\u0663 * * * *", "minute field: step '\u0663' must be a number"),
        ("0 0 * \uff4aan *", "month field: '\uff4aan' is not a number or a name"),
        ("0 0 * * \u017fun", "day of week field: '\u017fun' is not a number or a name"),
        ("+1 * * * *", "minute field: '\\+1' is not a number"),
        ("1_0 * * * *", "minute field: '1_0' is not a number"),
        ("0 1-2-3 * * *", "hour field: '2-3' is not a number"),
        ("0\u00a00 * * *", "expected 5 fields .* got 4"),
        ("0 0 * * *\n", "day of week field: .* is not a number or a name"),
        ("", "got 0"),
        ("0 0 * * *" + " " * 192, "is 201 characters long, at most 200"),
        ("0 0 30 2 *", "day of month field: '30' never occurs in month field '2'"),
        ("0 0 30,31 feb *", "day of month field: '30,31' never occurs"),
        ("0 0 31 apr-jun/2 *", "day of month field: '31' never occurs in month field 'apr-jun/2'"),
        ("0 0 30 2 */7", "day of month field: '30' never occurs"),  # AND with the weekday: still never
    ],
)
def test_malformed_or_dead_expressions_are_refused_naming_the_field(expr: str, reason: str) -> None:
    with pytest.raises(CronError, match=reason):
        CronExpression.parse(expr)


@pytest.mark.parametrize(
    ("expr", "field", "values"),
    [
        ("*/60 * * * *", "minutes", (0,)),  # a step may be as large as the field has values
        ("0 */24 * * *", "hours", (0,)),
        ("0 0 */31 * *", "days", frozenset({1})),
        ("0 0 1 */12 *", "months", (1,)),
        ("0 0 * * */7", "weekdays", frozenset({0})),
        ("0 0 * * 5-7", "weekdays", frozenset({0, 5, 6})),
        ("0 0 * * MON-fri", "weekdays", frozenset({1, 2, 3, 4, 5})),
        ("07,0010 * * * *", "minutes", (7, 10)),
        ("5/20 * * * *", "minutes", (5, 25, 45)),
    ],
)
def test_edge_values_that_are_accepted(expr: str, field: str, values: object) -> None:
    assert getattr(CronExpression.parse(expr), field) == values


def test_fields_are_separated_by_any_run_of_spaces_or_tabs() -> None:
    assert CronExpression.parse(" \t0  9\t* *  mon-fri ").text == "0 9 * * mon-fri"
    assert CronExpression.parse("0 0 * * *" + " " * 191).text == "0 0 * * *"  # 200 characters


def test_an_or_of_day_fields_fires_even_when_the_day_of_month_never_exists() -> None:
    # Both day fields restricted: 30 February never comes, but Mondays in February do.
    assert CronExpression.parse("0 0 30 2 mon").next_after(at("2026-01-01T00:00"), UTC) == at("2026-02-02T00:00")


def test_a_rare_weekday_and_date_combination_keeps_firing() -> None:
    # Day of month 31 AND Sunday: only years in which 31 December is a Sunday.
    expr = CronExpression.parse("0 0 31 12 */7")
    assert expr.next_after(at("2034-12-31T00:00"), UTC) == at("2045-12-31T00:00")
    assert [t.year for t in expr.upcoming(at("2026-01-01T00:00"), UTC, 6)] == [2028, 2034, 2045, 2051, 2056, 2062]


def test_29_february_on_a_sunday_keeps_firing_across_a_40_year_gap() -> None:
    times = CronExpression.parse("0 0 29 2 */7").upcoming(at("2000-01-01T00:00"), UTC, 8)
    assert [t.year for t in times] == [2004, 2032, 2060, 2088, 2128, 2156, 2184, 2224]
    assert all((t.month, t.day, t.isoweekday()) == (2, 29, 7) for t in times)


def test_a_date_anded_with_a_weekday_fires_exactly_when_the_date_exists() -> None:
    # Within the 400-year Gregorian cycle every existing date falls on every weekday, so only a
    # date that never exists may make an expression dead.
    for month in range(1, 13):
        for day in range(1, 32):
            text = f"0 0 {day} {month} */7"
            if day > monthrange(2000, month)[1]:  # 2000 is a leap year
                with pytest.raises(CronError, match="never occurs"):
                    CronExpression.parse(text)
                continue
            fire = CronExpression.parse(text).next_after(at("2000-01-01T00:00"), UTC)
            assert (fire.month, fire.day, fire.isoweekday()) == (month, day, 7), text


def test_every_hour_means_an_hour_field_starting_with_a_star() -> None:
    assert [CronExpression.parse(f"0 {h} * * *").every_hour for h in ("*", "*/2", "*/1", "0-23", "1-23", "1")] == [
        True,
        True,
        True,
        False,
        False,
        False,
    ]


def test_an_hour_step_starting_with_a_star_fires_in_both_passes_of_a_repeated_hour() -> None:
    # Berlin repeats 02:00-02:59 on 25 October 2026.
    assert upcoming("0 */2 * * *", at("2026-10-24T23:00"), BERLIN, 3) == [
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T02:00:00+01:00",
        "2026-10-25T04:00:00+01:00",
    ]
    assert upcoming("0 0-23/2 * * *", at("2026-10-24T23:00"), BERLIN, 2) == [
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T04:00:00+01:00",
    ]


def test_an_hour_range_fires_once_in_a_repeated_hour() -> None:
    assert upcoming("15 1-23 * * *", at("2026-10-24T23:30"), LONDON, 2) == [
        "2026-10-25T01:15:00+01:00",
        "2026-10-25T02:15:00+00:00",
    ]


def test_a_minute_star_with_a_fixed_hour_fires_in_the_first_pass_only() -> None:
    times = CronExpression.parse("* 1 * * *").upcoming(at("2026-10-24T23:59"), LONDON, 61)
    assert times[0] == at("2026-10-25T00:00") and times[59] == at("2026-10-25T00:59")
    assert times[60] == at("2026-10-26T01:00")


def test_every_minute_follows_real_time_through_a_repeated_hour() -> None:
    times = CronExpression.parse("* * * * *").upcoming(at("2026-10-24T23:59:30"), LONDON, 150)
    assert all(b - a == timedelta(minutes=1) for a, b in pairwise(times))


def test_every_hour_from_inside_the_first_pass_finds_the_second_pass() -> None:
    # 01:40 BST: the next 01:15 is the one in GMT, 35 real minutes later.
    assert CronExpression.parse("15 * * * *").next_after(at("2026-10-25T00:40"), LONDON) == at("2026-10-25T01:15")


def test_a_repeated_day_is_searched_from_its_start() -> None:
    # Apia repeated 4 July 1892 (24 hours): far more than any DST change.
    first_pass = datetime(1892, 7, 4, 23, 30, tzinfo=APIA)
    hourly = CronExpression.parse("0 * * * *").next_after(first_pass, APIA)
    assert hourly.astimezone(APIA).isoformat() == "1892-07-04T00:00:00-11:26:56"
    daily = CronExpression.parse("0 12 * * *").next_after(first_pass, APIA)
    assert daily.astimezone(APIA).isoformat() == "1892-07-05T12:00:00-11:26:56"


def test_thirty_minute_dst_changes() -> None:
    assert upcoming("15 2 * * *", at("2026-10-03T12:00"), LORD_HOWE, 2) == [
        "2026-10-04T02:30:00+11:00",  # 02:00-02:29 do not exist
        "2026-10-05T02:15:00+11:00",
    ]
    assert upcoming("45 1 * * *", at("2026-04-04T12:00"), LORD_HOWE, 2) == [
        "2026-04-05T01:45:00+11:00",
        "2026-04-06T01:45:00+10:30",
    ]
    assert upcoming("45 * * * *", at("2026-04-04T14:00"), LORD_HOWE, 3) == [
        "2026-04-05T01:45:00+11:00",
        "2026-04-05T01:45:00+10:30",
        "2026-04-05T02:45:00+10:30",
    ]


def test_a_skipped_day_fires_once_at_the_transition() -> None:
    # Apia skipped 30 December 2011 altogether.
    assert upcoming("0 12 * * *", at("2011-12-29T23:00"), APIA, 2) == [
        "2011-12-31T00:00:00+14:00",
        "2011-12-31T12:00:00+14:00",
    ]
    assert upcoming("0 * * * *", at("2011-12-30T09:30"), APIA, 2) == [
        "2011-12-31T00:00:00+14:00",
        "2011-12-31T01:00:00+14:00",
    ]


# Property-style checks: a seeded random loop (hypothesis is not installed).

_RANGES = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)]
_NAMES = [None, None, None, ["jan", "Feb", "MAR", "jun", "dec"], ["sun", "Mon", "fri", "SAT"]]


def random_field(rng: random.Random, index: int) -> str:
    low, high = _RANGES[index]
    span = high - low + 1 if index != 4 else 7

    def value() -> str:
        names = _NAMES[index]
        return rng.choice(names) if names and rng.random() < 0.2 else str(rng.randint(low, high))

    def part() -> str:
        kind = rng.randrange(6)
        if kind == 0:
            return "*"
        if kind == 1:
            return f"*/{rng.randint(1, span)}"
        if kind in (2, 3):
            a, b = sorted(rng.sample(range(low, high + 1), 2))
            return f"{a}-{b}" + (f"/{rng.randint(1, span)}" if kind == 3 else "")
        if kind == 4:
            return f"{rng.randint(low, high)}/{rng.randint(1, span)}"
        return value()

    return ",".join(part() for _ in range(rng.choice((1, 1, 1, 2, 3))))


def random_expression(rng: random.Random) -> CronExpression:
    while True:
        try:
            return CronExpression.parse(" ".join(random_field(rng, i) for i in range(5)))
        except CronError as exc:
            assert "never occurs" in str(exc)


def matches(expr: CronExpression, wall: datetime) -> bool:
    in_month = wall.day in expr.days
    in_week = wall.isoweekday() % 7 in expr.weekdays
    day = (in_month or in_week) if expr.day_or else (in_month and in_week)
    return day and wall.month in expr.months and wall.hour in expr.hours and wall.minute in expr.minutes


def brute_next_utc(expr: CronExpression, after: datetime) -> datetime:
    day = after.date()
    while True:
        for hour in expr.hours:
            for minute in expr.minutes:
                candidate = datetime.combine(day, time(hour, minute), UTC)
                if candidate > after and matches(expr, candidate):
                    return candidate
        day += timedelta(days=1)


def transitions(zone: ZoneInfo, year: int) -> list[datetime]:
    found = []
    t = datetime(year, 1, 1, tzinfo=UTC)
    while t.year == year:
        low, high = t, t + timedelta(hours=6)
        if low.astimezone(zone).utcoffset() != high.astimezone(zone).utcoffset():
            while high - low > timedelta(seconds=1):
                mid = low + (high - low) / 2
                if mid.astimezone(zone).utcoffset() == high.astimezone(zone).utcoffset():
                    high = mid
                else:
                    low = mid
            found.append(high)
        t += timedelta(hours=6)
    return found


def is_fire(expr: CronExpression, t: datetime, zone: ZoneInfo) -> bool:
    wall = t.astimezone(zone)
    if matches(expr, wall):
        # A fixed-hour time fires only in the first pass of a repeated hour.
        return wall.fold == 0 or expr.every_hour
    # Otherwise ``t`` must be a transition that swallowed a matching wall time.
    before = (t - timedelta(seconds=1)).astimezone(zone).replace(tzinfo=None) + timedelta(seconds=1)
    missing = before.replace(second=0) + timedelta(minutes=1 if before.second else 0)
    while missing < wall.replace(tzinfo=None):
        if matches(expr, missing):
            return True
        missing += timedelta(minutes=1)
    return False


def test_next_fire_agrees_with_a_day_by_day_walk() -> None:
    rng = random.Random(20260101)
    for _ in range(400):
        expr = random_expression(rng)
        after = at("1990-01-01T00:00") + timedelta(seconds=rng.randrange(120 * 365 * 86400))
        assert expr.next_after(after, UTC) == brute_next_utc(expr, after), expr.text


@pytest.mark.parametrize("zone", [LONDON, NEW_YORK, LORD_HOWE, APIA], ids=str)
def test_random_expressions_always_fire_again_in_zones_with_dst(zone: ZoneInfo) -> None:
    rng = random.Random(f"cron {zone.key}")
    edges = [t for year in (1892, 1971, 2011, 2012, 2026, 2037) for t in transitions(zone, year)]
    for _ in range(250):
        expr = random_expression(rng)
        if rng.random() < 0.5:
            after = rng.choice(edges) + timedelta(seconds=rng.randint(-3 * 3600, 3 * 3600))
        else:
            after = at("1971-01-01T00:00") + timedelta(seconds=rng.randrange(130 * 365 * 86400))
        times = expr.upcoming(after, zone, 10)
        assert times[0] > after, expr.text
        assert all(a < b for a, b in pairwise(times)), expr.text
        assert all(is_fire(expr, t, zone) for t in times), (expr.text, after)


def test_an_expression_is_parsed_once_and_an_invalid_one_fails_every_time() -> None:
    assert CronExpression.parse("17 3 * * mon") is CronExpression.parse("17 3 * * mon")
    for _ in range(2):
        with pytest.raises(CronError, match="expected 5 fields"):
            CronExpression.parse("17 3 * *")
    with pytest.raises(CronError, match="must be a string"):
        CronExpression.parse(["0", "2", "*", "*", "*"])  # type: ignore[arg-type]
