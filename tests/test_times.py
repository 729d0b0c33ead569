"""How the CLI and the dashboard write times and lengths of time: one pure formatter, no Redis."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from celeryapp.domain.cadence import fire_times
from celeryapp.domain.times import iso, parse_time, span
from celeryapp.interfaces.time_words import clock, relative, stamp, took, zone_of
from celeryapp.interfaces.web.humanize import cadence_words

NOW = datetime(2026, 11, 22, 12, 0, 0, 123456, tzinfo=UTC)
LONDON = ZoneInfo("Europe/London")


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0, "0 s"),
        (0.04, "0.0 s"),
        (0.4, "0.4 s"),
        (5, "5 s"),
        (9.96, "10.0 s"),
        (12.7, "12 s"),
        (184, "3 min 4 s"),
        (3600, "1 h"),
        (3605, "1 h 5 s"),
        (18720, "5 h 12 min"),
        (183600, "2 d 3 h"),
        (-30, "30 s"),
        (-0.5, "0.5 s"),
        (10**12, "11574074 d 1 h"),
    ],
)
def test_spans_read_like_people_say_them(seconds: float, shown: str) -> None:
    assert span(seconds) == shown


@pytest.mark.parametrize("seconds", [None, math.nan, math.inf, -math.inf])
def test_a_span_that_is_not_a_number_shows_as_nothing(seconds: float | None) -> None:
    assert span(seconds) == "-"


def test_the_largest_finite_span_is_written_in_days() -> None:
    days, _, hours = span(-1.7e308).partition(" d ")
    assert days.isdigit() and len(days) > 300 and hours.endswith(" h")


def test_times_are_in_the_zone_with_offset_and_relative_without_microseconds() -> None:
    summer = datetime(2026, 7, 1, 1, 0, 0, 999999, tzinfo=UTC)
    assert clock(summer, LONDON) == "2026-07-01 02:00:00 +01:00 BST"
    assert clock(summer, "Europe/London") == "2026-07-01 02:00:00 +01:00 BST"
    assert clock(NOW, LONDON) == "2026-11-22 12:00:00 +00:00 GMT"
    assert clock(NOW, ZoneInfo("Asia/Kolkata")) == "2026-11-22 17:30:00 +05:30 IST"
    assert stamp("2026-11-22T17:12:00.000Z", LONDON, None, NOW) == "2026-11-22 17:12:00 +00:00 GMT, in 5 h 11 min"
    assert stamp(None, LONDON, None, NOW) == "-"
    assert relative(NOW, NOW) == "now"
    assert relative(datetime(2026, 11, 22, 11, 57, tzinfo=UTC), NOW) == "3 min ago"


def test_hostile_instants_and_zones() -> None:
    assert clock(None, LONDON) == "-"
    assert relative(None, NOW) == "-"
    # A zone name that is no zone (a schedule stored before zones were checked) shows UTC.
    assert clock(NOW, "Not/AZone") == clock(NOW, "UTC") == "2026-11-22 12:00:00 +00:00 UTC"
    assert clock(NOW, "../../etc/passwd") == clock(NOW, "UTC")
    assert zone_of(None) == zone_of("") == ZoneInfo("UTC")
    assert relative(NOW + timedelta(seconds=9.6), NOW) == "in 10 s"
    assert relative(NOW - timedelta(seconds=0.4), NOW) == "now"
    far = datetime.max.replace(tzinfo=UTC)
    assert relative(far, datetime.min.replace(tzinfo=UTC)) == "in 3652059 d"  # to the float's precision
    assert stamp(far, LONDON, None, NOW).startswith("9999-12-31 23:59:59 +00:00 GMT, in ")
    assert parse_time("2026-11-22T12:00:00") == datetime(2026, 11, 22, 12, tzinfo=UTC)  # no zone: UTC
    assert parse_time("") is None


def test_durations_of_finished_and_running_things() -> None:
    assert took("2026-11-22T11:59:00.000Z", "2026-11-22T11:59:04.200Z", NOW) == "4.2 s"
    assert took("2026-11-22T11:58:00.000Z", None, NOW) == "2 min so far"
    assert took(None, None, NOW) == "-"
    # The dashboard passes datetimes, the CLI the contract's strings: the same words.
    assert took(datetime(2026, 11, 22, 11, 58, tzinfo=UTC), None, NOW) == "2 min so far"
    assert took(datetime(2026, 11, 22, 9, 0, tzinfo=UTC), NOW, NOW) == "3 h"


def test_a_clock_that_went_back_is_no_time_not_a_negative_one() -> None:
    assert took("2026-11-22T12:00:05.000Z", "2026-11-22T12:00:00.000Z", NOW) == "0 s"
    assert took("2026-11-22T12:30:00.000Z", None, NOW) == "0 s so far"


def test_the_dashboard_writes_cadences_with_the_same_spans() -> None:
    assert cadence_words(None, 300, "UTC") == "every 5 min"
    assert cadence_words(None, 5, "UTC") == "every 5 s"
    assert cadence_words(None, 90, "UTC") == f"every {span(90)}" == "every 1 min 30 s"


def test_fire_times_cross_dst_with_their_offsets() -> None:
    first = datetime(2026, 10, 20, 1, 0, tzinfo=UTC)
    times = fire_times(first, cron="0 2 * * *", every_s=None, zone=LONDON, count=10)
    shown = [clock(t, LONDON) for t in times]
    assert shown[0] == "2026-10-20 02:00:00 +01:00 BST"
    assert "2026-10-26 02:00:00 +00:00 GMT" in shown
    assert [s[:19] for s in shown] == [f"2026-10-{20 + i} 02:00:00" for i in range(10)]


def test_interval_fire_times_and_none_to_show() -> None:
    first = datetime(2026, 1, 1, tzinfo=UTC)
    times = fire_times(first, cron=None, every_s=90, zone=LONDON, count=3)
    assert [t.isoformat() for t in times] == [
        "2026-01-01T00:00:00+00:00",
        "2026-01-01T00:01:30+00:00",
        "2026-01-01T00:03:00+00:00",
    ]
    assert fire_times(None, cron=None, every_s=90, zone=LONDON, count=3) == []
    assert fire_times(first, cron="0 2 * * *", every_s=None, zone=LONDON, count=0) == []
    assert fire_times(first, cron="0 2 * * *", every_s=None, zone=LONDON, count=-5) == []


def test_iso_writes_utc_with_a_z_to_the_millisecond_or_as_asked() -> None:
    moment = datetime(2026, 11, 22, 2, 0, 0, 123456, tzinfo=UTC)
    assert iso(moment) == "2026-11-22T02:00:00.123Z"
    assert iso(moment, timespec="seconds") == "2026-11-22T02:00:00Z"
    # The same instant given in another zone is written the same way: one format for machines.
    assert iso(moment.astimezone(ZoneInfo("Asia/Kolkata"))) == "2026-11-22T02:00:00.123Z"
    assert iso(None) is None


KOLKATA = ZoneInfo("Asia/Kolkata")


def test_one_stamp_the_schedules_zone_the_viewers_beside_it_and_how_far() -> None:
    moment = datetime(2026, 11, 22, 2, 0, tzinfo=UTC)
    assert stamp(moment, LONDON, KOLKATA, NOW) == "2026-11-22 02:00:00 +00:00 GMT, 07:30 IST here, 10 h ago"
    # The same offset (here or UTC in winter) is the same wall time: nothing beside it.
    assert stamp(moment, LONDON, LONDON, NOW) == "2026-11-22 02:00:00 +00:00 GMT, 10 h ago"
    assert stamp(moment, LONDON, "UTC", NOW) == stamp(moment, LONDON, None, NOW)
    # In summer London is an hour ahead of UTC: a UTC viewer sees their own time beside it.
    summer = datetime(2026, 7, 1, 1, 0, tzinfo=UTC)
    assert stamp(summer, "Europe/London", "UTC", NOW).startswith("2026-07-01 02:00:00 +01:00 BST, 01:00 UTC here, ")
    # Another day where the viewer is: the date is said.
    late = datetime(2026, 11, 22, 20, 0, tzinfo=UTC)
    assert (
        stamp(late, LONDON, KOLKATA, NOW) == "2026-11-22 20:00:00 +00:00 GMT, 2026-11-23 01:30 IST here, in 7 h 59 min"
    )
    # The contract's strings are read the same; none is "-".
    assert stamp("2026-11-22T02:00:00.000Z", LONDON, KOLKATA, NOW) == stamp(moment, LONDON, KOLKATA, NOW)
    assert stamp(None, LONDON, KOLKATA, NOW) == "-"


def test_a_stamp_is_never_iso_and_numeric_zone_names_show_as_offsets() -> None:
    moment = datetime(2026, 11, 22, 2, 0, tzinfo=UTC)
    # America/Sao_Paulo has no letters for its zone (its abbreviation is "-03").
    assert clock(moment, "America/Sao_Paulo") == "2026-11-21 23:00:00 -03:00"
    assert stamp(moment, LONDON, "America/Sao_Paulo", NOW) == (
        "2026-11-22 02:00:00 +00:00 GMT, 2026-11-21 23:00 -03:00 here, 10 h ago"
    )
    # A viewer's zone that is a fixed offset (a POSIX TZ read from the C library) works too.
    fixed = datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=5, minutes=30)))
    assert stamp(moment, LONDON, fixed.tzinfo, NOW) == "2026-11-22 02:00:00 +00:00 GMT, 07:30 UTC+05:30 here, 10 h ago"
    for zone in ("UTC", "Asia/Kolkata", "America/Sao_Paulo", "Pacific/Chatham"):
        text = stamp(moment, zone, "Asia/Kolkata", NOW)
        assert not re.search(r"T\d\d:|Z\b", text), text
