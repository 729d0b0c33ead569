"""Deadline rules (celeryapp/domain/deadlines.py): finish_by in the schedule's zone across clock
changes, the earliest of finish_within and finish_by, which slots are due, and the expected finish.

Pure functions, so hypothesis drives them over slots around the transitions of zones with odd
rules (half-hour DST in Lord Howe, Samoa's skipped day, southern-hemisphere DST); the examples pin
the answers people read in docs/alerts.md (Europe/London 06:00 in March and October).
"""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celeryapp.domain.cadence import Cadence
from celeryapp.domain.calendars import Calendar
from celeryapp.domain.deadlines import (
    FINISH_BY_MAX_S,
    MIN_RUNS,
    RECENT_RUNS,
    expected_finish,
    finish_by_after,
    finish_by_before,
    finish_deadline,
    first_running_slot,
    last_slot_due,
    longest_s,
    newest_slots,
    start_deadline,
)

ZONES = (
    "UTC",
    "Europe/London",
    "America/New_York",
    "Australia/Lord_Howe",
    "America/Santiago",
    "Pacific/Apia",
    "Asia/Kolkata",
)


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


#: Instants from 2011 (Samoa's skipped day) to 2030, to the second.
instants = st.integers(min_value=int(utc(2011, 1, 1).timestamp()), max_value=int(utc(2030, 1, 1).timestamp())).map(
    lambda s: datetime.fromtimestamp(s, UTC)
)
#: Instants within a day of a 2026 clock change in London, New York or Lord Howe.
_CHANGES = (utc(2026, 3, 29, 1), utc(2026, 10, 25, 1), utc(2026, 3, 8, 7), utc(2026, 11, 1, 6), utc(2026, 4, 4, 15))
near_changes = st.tuples(st.sampled_from(_CHANGES), st.integers(min_value=-86400, max_value=86400)).map(
    lambda c: c[0] + timedelta(seconds=c[1])
)
slots = st.one_of(instants, near_changes)
walls = st.builds(time, st.integers(min_value=0, max_value=23), st.sampled_from([0, 0, 1, 15, 30, 45, 59]))
wall_texts = walls.map(lambda w: f"{w.hour:02d}:{w.minute:02d}")
zones = st.sampled_from(ZONES)
seconds = st.one_of(st.none(), st.integers(min_value=1, max_value=3 * 86400).map(float))


@pytest.mark.parametrize(
    ("slot", "deadline"),
    [
        # Winter (GMT): 06:00 London is 06:00 UTC.
        (utc(2026, 3, 28, 1, 0), utc(2026, 3, 28, 6, 0)),
        # Clocks go forward at 01:00 UTC on 29 March: the next 06:00 is BST, 05:00 UTC (a 23-hour night).
        (utc(2026, 3, 28, 22, 0), utc(2026, 3, 29, 5, 0)),
        (utc(2026, 3, 29, 4, 59, 59), utc(2026, 3, 29, 5, 0)),
        (utc(2026, 3, 29, 5, 0), utc(2026, 3, 30, 5, 0)),  # strictly after the slot
        # Clocks go back at 01:00 UTC on 25 October: 06:00 is GMT again, 06:00 UTC (a 25-hour night).
        (utc(2026, 10, 24, 22, 0), utc(2026, 10, 25, 6, 0)),
        (utc(2026, 10, 24, 5, 30), utc(2026, 10, 25, 6, 0)),
    ],
)
def test_finish_by_0600_in_london_follows_the_clocks(slot: datetime, deadline: datetime) -> None:
    assert finish_by_after(slot, time(6, 0), "Europe/London") == deadline
    assert finish_deadline(slot, finish_within_s=None, finish_by="06:00", zone="Europe/London") == deadline


@pytest.mark.parametrize(
    ("slot", "wall", "zone", "deadline"),
    [
        # 01:30 does not exist in London on 29 March 2026 (01:00 GMT jumps to 02:00 BST, at 01:00 UTC).
        (utc(2026, 3, 28, 23, 0), time(1, 30), "Europe/London", utc(2026, 3, 29, 1, 0)),
        # 02:30 does not exist in New York on 8 March 2026: the clocks jump at 07:00 UTC.
        (utc(2026, 3, 8, 3, 0), time(2, 30), "America/New_York", utc(2026, 3, 8, 7, 0)),
        # 01:30 happens twice in London on 25 October 2026: 00:30 UTC (BST) and 01:30 UTC (GMT).
        (utc(2026, 10, 24, 23, 0), time(1, 30), "Europe/London", utc(2026, 10, 25, 0, 30)),
        (utc(2026, 10, 25, 0, 45), time(1, 30), "Europe/London", utc(2026, 10, 25, 1, 30)),
        # 30 December 2011 never happened in Samoa: at midnight (10:00 UTC) the clocks jumped from
        # the 29th to the 31st, past 12:00 on the 30th.
        (utc(2011, 12, 29, 23, 0), time(12, 0), "Pacific/Apia", utc(2011, 12, 30, 10, 0)),
    ],
)
def test_finish_by_on_a_skipped_or_repeated_time(slot: datetime, wall: time, zone: str, deadline: datetime) -> None:
    assert finish_by_after(slot, wall, zone) == deadline


@settings(max_examples=400)
@given(slots, walls, zones)
def test_finish_by_is_the_first_time_the_clock_shows_it_after_the_slot(slot: datetime, wall: time, zone: str) -> None:
    deadline = finish_by_after(slot, wall, zone)
    assert slot < deadline <= slot + timedelta(seconds=FINISH_BY_MAX_S)
    assert deadline.tzinfo is not None and deadline.utcoffset() == timedelta(0)
    shown = deadline.astimezone(ZoneInfo(zone)).replace(tzinfo=None)
    if shown.time() != wall:
        # Skipped by a clock change: a moment before, the clock showed a time before the wall
        # time on that day; at the deadline, one after it.
        before = (deadline - timedelta(seconds=1)).astimezone(ZoneInfo(zone)).replace(tzinfo=None)
        wanted = datetime.combine(shown.date(), wall)
        assert before < wanted < shown
    # No showing of the wall time lies between the slot and the deadline.
    assert finish_by_before(deadline - timedelta(microseconds=1), wall, zone) <= slot
    assert finish_by_before(deadline, wall, zone) == deadline


@settings(max_examples=400)
@given(slots, seconds, st.one_of(st.none(), wall_texts), zones)
def test_the_finish_deadline_is_the_earliest_of_its_parts(
    slot: datetime, within_s: float | None, by: str | None, zone: str
) -> None:
    deadline = finish_deadline(slot, finish_within_s=within_s, finish_by=by, zone=zone)
    parts = []
    if within_s is not None:
        parts.append(slot + timedelta(seconds=within_s))
    if by is not None:
        hours, minutes = by.split(":")
        parts.append(finish_by_after(slot, time(int(hours), int(minutes)), zone))
    assert deadline == (min(parts) if parts else None)
    if deadline is not None:
        assert slot < deadline <= slot + timedelta(seconds=longest_s(None, within_s, by))


@settings(max_examples=400)
@given(slots, st.integers(min_value=-3 * 86400, max_value=3 * 86400), seconds, st.one_of(st.none(), wall_texts), zones)
def test_a_slot_is_due_exactly_when_its_finish_deadline_passed(
    slot: datetime, later_s: int, within_s: float | None, by: str | None, zone: str
) -> None:
    now = slot + timedelta(seconds=later_s)
    deadline = finish_deadline(slot, finish_within_s=within_s, finish_by=by, zone=zone)
    last = last_slot_due(now, finish_within_s=within_s, finish_by=by, zone=zone)
    if deadline is None:
        assert last is None
    else:
        assert last is not None
        assert (deadline <= now) == (slot <= last)


def test_start_deadline() -> None:
    assert start_deadline(utc(2026, 1, 1), None) is None
    assert start_deadline(utc(2026, 1, 1), 900.0) == utc(2026, 1, 1, 0, 15)


durations = st.lists(st.floats(min_value=0, max_value=86400, allow_nan=False), max_size=15)


@given(instants, st.integers(min_value=0, max_value=86400), durations)
def test_the_expected_finish_is_never_before_now(started: datetime, ran_s: int, recent: list[float]) -> None:
    now = started + timedelta(seconds=ran_s)
    expected = expected_finish(started, now, recent)
    if len(recent) < MIN_RUNS:
        assert expected is None
        return
    assert expected is not None and expected >= now
    # Never later than the longest of the recent runs would have taken (or now).
    assert expected <= max(now, started + timedelta(seconds=max(recent[:RECENT_RUNS])))


def test_the_expected_finish_is_the_median_of_runs_longer_than_this_one_so_far() -> None:
    started = utc(2026, 1, 1)
    # Just started: the median of all (newest first; only the first RECENT_RUNS count).
    recent = [60.0, 10.0, 20.0] + [1000.0] * RECENT_RUNS
    assert expected_finish(started, started, recent) == started + timedelta(seconds=1000)
    assert expected_finish(started, started, [60.0, 10.0, 20.0]) == started + timedelta(seconds=20)
    # Already 30 s in: the 10 s and 20 s runs say nothing about this one; the 60 s one does.
    assert expected_finish(started, started + timedelta(seconds=30), [60.0, 10.0, 20.0]) == started + timedelta(
        seconds=60
    )
    # Past all of them: expected now, not in the past.
    now = started + timedelta(seconds=90)
    assert expected_finish(started, now, [60.0, 10.0, 20.0]) == now
    assert expected_finish(started, now, [60.0, 10.0]) is None


@settings(max_examples=200)
@given(
    st.sampled_from(["*/5 * * * *", "0 6 * * *", "30 1 * * 0", None]),
    st.integers(min_value=30, max_value=5000),
    st.sampled_from(["Europe/London", "America/New_York", "UTC"]),
    near_changes,
    st.integers(min_value=0, max_value=3 * 86400),
    st.integers(min_value=1, max_value=6),
)
def test_newest_slots_are_the_last_slots_of_the_window_newest_first(
    cron: str | None, every_s: int, zone: str, since: datetime, span_s: int, cap: int
) -> None:
    cadence = Cadence(cron=cron, every_s=None if cron else float(every_s), timezone=zone, anchor=since)
    until = since + timedelta(seconds=span_s)
    found = newest_slots(cadence, since=since, until=until, cap=cap)
    every, _ = cadence.slots_between(since - timedelta(microseconds=1), until, 10_000)
    assert found == list(reversed(every))[:cap]


def test_the_first_running_slot_skips_whole_excluded_days_on_the_schedules_clock() -> None:
    london = ZoneInfo("Europe/London")
    cadence = Cadence(cron="* * * * *", every_s=None, timezone="Europe/London", anchor=datetime(2026, 1, 1, tzinfo=UTC))
    # Summer: London's midnight is 23:00 UTC the evening before.
    first = datetime(2026, 8, 30, 22, 0, tzinfo=UTC)  # 23:00 on Sunday 30 August in London
    holidays = Calendar.of([first.astimezone(london).date(), datetime(2026, 8, 31).date()])
    tuesday = datetime(2026, 8, 31, 23, 0, tzinfo=UTC)  # 00:00 on Tuesday 1 September in London
    late = first + timedelta(days=3)
    assert first_running_slot(cadence, first, until=late, calendar=holidays) == tuesday
    assert first_running_slot(cadence, first, until=tuesday - timedelta(seconds=1), calendar=holidays) is None
    assert first_running_slot(cadence, first, until=late, calendar=None) == first
    assert first_running_slot(cadence, first, until=first - timedelta(seconds=1), calendar=None) is None
    # Every day excluded: the search ends (bounded), nothing runs.
    every_day = Calendar.of(first.date() + timedelta(days=n) for n in range(-1, 800))
    assert first_running_slot(cadence, first, until=first + timedelta(days=900), calendar=every_day) is None
