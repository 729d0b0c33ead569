"""Cron expressions and DST, with computed times (no waiting)."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from celeryapp.cron import CronError, CronExpression

LONDON = ZoneInfo("Europe/London")
NEW_YORK = ZoneInfo("America/New_York")


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
        ("*/0 * * * *", "step '0' must be a positive number"),
        ("5-1 * * * *", "runs backwards"),
        ("a * * * *", "is not a number"),
        ("1,,2 * * * *", "empty list item"),
        ("@daily", "expected 5 fields"),
    ],
)
def test_invalid_expressions_say_why(expr: str, reason: str) -> None:
    with pytest.raises(CronError, match=reason):
        CronExpression.parse(expr)


def test_an_expression_that_never_fires_is_an_error() -> None:
    with pytest.raises(CronError, match="never fires"):
        CronExpression.parse("0 0 30 2 *").next_after(at("2026-01-01T00:00"), UTC)
