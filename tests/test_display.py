"""How the CLI shows times, durations and states: pure functions, no Redis."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from celeryapp.interfaces.display import clock, relative, span, took, when
from celeryapp.interfaces.terminal import bar_style

NOW = datetime(2026, 11, 22, 12, 0, 0, 123456, tzinfo=UTC)
LONDON = ZoneInfo("Europe/London")


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0.04, "0.0 s"),
        (0.4, "0.4 s"),
        (9.96, "10.0 s"),
        (12.7, "12 s"),
        (184, "3 min 4 s"),
        (3600, "1 h"),
        (18720, "5 h 12 min"),
        (183600, "2 d 3 h"),
        (-30, "30 s"),
    ],
)
def test_spans_read_like_people_say_them(seconds: float, shown: str) -> None:
    assert span(seconds) == shown


def test_times_are_in_the_zone_with_offset_and_relative_without_microseconds() -> None:
    summer = datetime(2026, 7, 1, 1, 0, 0, 999999, tzinfo=UTC)
    assert clock(summer, LONDON) == "2026-07-01 02:00:00 +01:00 BST"
    assert clock(NOW, LONDON) == "2026-11-22 12:00:00 +00:00 GMT"
    assert clock(NOW, ZoneInfo("Asia/Kolkata")) == "2026-11-22 17:30:00 +05:30 IST"
    assert when("2026-11-22T17:12:00.000Z", LONDON, NOW) == "2026-11-22 17:12:00 +00:00 GMT, in 5 h 11 min"
    assert when(None, LONDON, NOW) == "-"
    assert relative(NOW, NOW) == "now"
    assert relative(datetime(2026, 11, 22, 11, 57, tzinfo=UTC), NOW) == "3 min ago"


def test_durations_of_finished_and_running_things() -> None:
    assert took("2026-11-22T11:59:00.000Z", "2026-11-22T11:59:04.200Z", NOW) == "4.2 s"
    assert took("2026-11-22T11:58:00.000Z", None, NOW) == "2 min so far"
    assert took(None, None, NOW) == "-"


def test_a_group_with_a_failed_step_is_not_a_green_bar() -> None:
    assert bar_style(["complete", "complete"]) == "green"
    assert bar_style(["complete", "complete_with_warning"]) == "yellow"
    assert bar_style(["complete", "failed_with_error", "complete_with_warning"]) == "red"
    assert bar_style(["cancelled"]) == "red"
