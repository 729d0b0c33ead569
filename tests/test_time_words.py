"""A schedule's time rules and a backfill's progress in words (pure; chordbeat show, chordbeat
backfills and the dashboard share them)."""

from __future__ import annotations

from typing import Any

from celeryapp.interfaces.time_words import (
    backfill_title,
    calendar_words,
    catchup_words,
    dst_words,
    progress_words,
    time_control_words,
)


def _backfill(**counts: int) -> dict[str, Any]:
    base = {"id": 3, "origin": "request", "status": "running", "total": 40, "started": 12}
    zero = {"running": 0, "completed": 0, "failed": 0, "cancelled": 0, "skipped": 0}
    return {**base, **zero, **counts}


def test_each_rule_says_the_default_when_left_out() -> None:
    assert catchup_words(None) == catchup_words({"policy": "latest"}) == "catch-up: latest (one run for missed slots)"
    assert calendar_words(None) == "calendar: none (every day runs)"
    assert dst_words(None, "0 2 * * *") is not None and dst_words(None, "0 2 * * *").startswith("DST: default rule")
    assert dst_words({"repeated": "last"}, None) is None  # an interval: no DST line at all
    assert dst_words({"missing": "skip"}, "0 2 * * *") == (
        "DST: a repeated time: default rule; a skipped time does not run that day"
    )


def test_given_rules_are_said_with_their_numbers() -> None:
    assert catchup_words({"policy": "all", "window": 90000, "max_runs": 1}) == (
        "catch-up: all (each missed slot of the last 1 d 1 h, at most 1 run, oldest first)"
    )
    assert catchup_words({"policy": "none"}).startswith("catch-up: none (missed slots are not made up")
    both = {"exclude": ["2030-12-25"], "calendars": ["uk", "ops"], "on_excluded": "next_business_day"}
    assert calendar_words(both) == (
        "calendar: 1 date excluded, calendars uk, ops; excluded days run the next business day"
    )
    assert calendar_words({"calendars": ["uk"]}) == "calendar: calendar uk; excluded days do not run"
    schedule = {"cron": None, "every": 60, "catchup": None, "calendar": None, "dst": None}
    assert len(time_control_words(schedule)) == 2


def test_progress_leaves_out_what_is_none() -> None:
    assert progress_words(_backfill(running=2, completed=9, failed=1)) == (
        "12/40 started, 2 running, 9 completed, 1 failed"
    )
    assert progress_words(_backfill(started=40, completed=38, skipped=2)) == (
        "40/40 started, 38 completed, 2 passed over"
    )
    assert backfill_title(_backfill()) == "#3 running"
    assert backfill_title({**_backfill(), "origin": "catchup", "status": "completed"}) == "#3 catch-up completed"
    assert backfill_title({**_backfill(), "origin": "moved"}) == "#3 moved slot running"
