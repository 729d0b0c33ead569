"""Business calendars' pure rules: a calendar file's text read bounded and line by line, names that
cannot leave the calendars directory, and which days are excluded and why."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celeryapp.domain.batching import Alone, BatchSchedule, Fire, decide_batchable
from celeryapp.domain.cadence import Cadence
from celeryapp.domain.calendars import (
    INLINE_REASON,
    MAX_BUSINESS_DAY_SEARCH_DAYS,
    MAX_CALENDAR_BYTES,
    MAX_CALENDAR_LINES,
    Calendar,
    CalendarError,
    calendar_name_problem,
    excluded_reason,
    is_excluded,
    next_business_day,
    parse_calendar,
    parse_date,
    slot_excluded,
)
from celeryapp.domain.decisions import FireDecision, ScheduleState, decide_calendar
from celeryapp.states import Overlap, ScheduleStatus, SlotOutcome, Trigger

UK_2026 = """\
# England and Wales bank holidays, 2026
2026-01-01  # New Year's Day
2026-04-03
2026-04-06

2026-12-25   # Christmas
2026-12-28
"""


def test_a_calendar_file_is_dates_comments_and_blank_lines() -> None:
    assert parse_calendar(UK_2026) == {
        date(2026, 1, 1),
        date(2026, 4, 3),
        date(2026, 4, 6),
        date(2026, 12, 25),
        date(2026, 12, 28),
    }
    assert parse_calendar("") == frozenset()
    assert parse_calendar("# nothing yet\n\n") == frozenset()
    assert parse_calendar("2026-12-25\r\n2026-12-25\r\n") == {date(2026, 12, 25)}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("2026-12-25\n2026-02-30\n", "line 2 is not a date that exists"),
        ("2026-02-29", "line 1 is not a date that exists"),
        ("2026-13-01", "line 1 is not a date that exists"),
        ("\n\n25/12/2026", "line 3 is not a date written YYYY-MM-DD"),
        ("2026-12-25 2026-12-26", "line 1 is not a date written YYYY-MM-DD"),
        ("\uff12\uff10\uff12\uff16-12-25", "is not a date written YYYY-MM-DD"),
        ("2026-1-5", "is not a date written YYYY-MM-DD"),
        ("20261225", "is not a date written YYYY-MM-DD"),
    ],
)
def test_a_bad_line_is_refused_naming_it(text: str, message: str) -> None:
    with pytest.raises(CalendarError, match=message) as caught:
        parse_calendar(text)
    # The line is named, its text never shown: any file of the directory can be named.
    bad = [line for line in text.splitlines() if line and line != "2026-12-25"]
    assert bad and not any(line in str(caught.value) for line in bad)


def test_a_leap_day_that_exists_is_read() -> None:
    assert parse_calendar("2028-02-29") == {date(2028, 2, 29)}
    assert parse_date("2028-02-29") == date(2028, 2, 29)


def test_a_million_line_calendar_is_refused_unread() -> None:
    with pytest.raises(CalendarError, match=f"has more than {MAX_CALENDAR_LINES} lines"):
        parse_calendar("\n" * 1_000_000)
    with pytest.raises(CalendarError, match=f"has more than {MAX_CALENDAR_LINES} lines"):
        parse_calendar("2026-12-25\n" * (MAX_CALENDAR_LINES + 1))
    # The bound itself is fine.
    assert parse_calendar("2026-12-25\n" * MAX_CALENDAR_LINES) == {date(2026, 12, 25)}


def test_an_oversized_calendar_is_refused() -> None:
    with pytest.raises(CalendarError, match=f"is more than {MAX_CALENDAR_BYTES} bytes"):
        parse_calendar("#" * (MAX_CALENDAR_BYTES + 1))


@pytest.mark.parametrize("name", ["uk-bank-holidays", "de.by", "NYSE_2026", "a", "x" * 64])
def test_calendar_names(name: str) -> None:
    assert calendar_name_problem(name) is None


@pytest.mark.parametrize(
    "name",
    ["../etc/passwd", "/etc/passwd", "..", ".hidden", "a/b", "a..b", "", "x" * 65, "a b", "a\n", "ü", "-x"],
)
def test_names_that_could_leave_the_directory_are_refused(name: str) -> None:
    problem = calendar_name_problem(name)
    assert problem is not None and "is not a calendar name" in problem


def test_a_name_that_is_not_a_string_is_refused() -> None:
    assert calendar_name_problem(3) == "must be a calendar name, got int"


def test_reasons_say_where_the_exclusion_comes_from() -> None:
    christmas, boxing = date(2026, 12, 25), date(2026, 12, 26)
    calendar = Calendar.of([christmas], [("uk-bank-holidays", parse_calendar(UK_2026)), ("extra", [boxing])])
    assert excluded_reason(christmas, calendar) == INLINE_REASON
    assert excluded_reason(date(2026, 12, 28), calendar) == "in calendar 'uk-bank-holidays'"
    assert excluded_reason(boxing, calendar) == "in calendar 'extra'"
    assert excluded_reason(date(2026, 12, 29), calendar) is None
    assert is_excluded(christmas, calendar) and not is_excluded(date(2026, 12, 29), calendar)


def test_next_business_day_skips_weekends_and_excluded_days() -> None:
    calendar = Calendar.of([], [("uk", parse_calendar(UK_2026))])
    # Thursday 24 December: Friday is Christmas, then a weekend, then Monday 28th's holiday.
    assert next_business_day(date(2026, 12, 24), calendar) == date(2026, 12, 29)
    assert next_business_day(date(2026, 4, 2), calendar) == date(2026, 4, 7)
    assert next_business_day(date(2026, 11, 27), Calendar.of([])) == date(2026, 11, 30)


def test_next_business_day_is_bounded() -> None:
    start = date(2026, 1, 1)
    everything = Calendar.of(start + timedelta(days=n) for n in range(MAX_BUSINESS_DAY_SEARCH_DAYS + 1))
    with pytest.raises(CalendarError, match="no business day within 366 days after 2026-01-01"):
        next_business_day(start, everything)
    with pytest.raises(CalendarError, match="no business day"):
        next_business_day(date.max, Calendar.of([]))


@given(st.dates(max_value=date(9000, 1, 1)), st.sets(st.dates(min_value=date(2000, 1, 1), max_value=date(2030, 1, 1))))
def test_next_business_day_is_the_first_weekday_not_excluded(day: date, excluded: set[date]) -> None:
    calendar = Calendar.of(excluded)
    found = next_business_day(day, calendar)
    assert found > day and found.weekday() < 5 and not is_excluded(found, calendar)
    between = (day + timedelta(days=n) for n in range(1, (found - day).days))
    assert all(d.weekday() >= 5 or is_excluded(d, calendar) for d in between)


@given(st.lists(st.dates(), max_size=50))
def test_a_written_calendar_reads_back(dates: list[date]) -> None:
    text = "# generated\n" + "".join(f"{d.isoformat()}  # day {i}\n\n" for i, d in enumerate(dates))
    assert parse_calendar(text) == set(dates)


def test_a_slots_day_is_its_date_on_the_schedules_wall_clock() -> None:
    calendar = Calendar.of([date(2026, 12, 25)])
    # 23:30 UTC on the 24th is already the 25th in Tokyo, and still the 24th in London.
    late_on_the_24th = datetime(2026, 12, 24, 23, 30, tzinfo=UTC)
    assert slot_excluded(late_on_the_24th, ZoneInfo("Asia/Tokyo"), calendar) == INLINE_REASON
    assert slot_excluded(late_on_the_24th, ZoneInfo("Europe/London"), calendar) is None
    # 01:00 UTC on the 26th is still the 25th in New York.
    assert slot_excluded(datetime(2026, 12, 26, 1, tzinfo=UTC), ZoneInfo("America/New_York"), calendar)


def test_only_a_slot_that_would_start_is_skipped_by_its_calendar() -> None:
    asked: list[bool] = []

    def excluded() -> str:
        asked.append(True)
        return "in calendar 'uk'"

    start = FireDecision(start=True, claims_slot=True)
    assert decide_calendar(start, excluded) == FireDecision(
        outcome=SlotOutcome.SKIPPED_CALENDAR, reason="not run: in calendar 'uk'", claims_slot=True
    )
    assert decide_calendar(start, lambda: None) == start
    asked.clear()
    # A retry (no slot claimed), a pause, a supersede keep their own outcome; the files are not read.
    for other in (
        FireDecision(start=True),
        FireDecision(outcome=SlotOutcome.SKIPPED_PAUSED, reason="schedule is paused"),
        FireDecision(outcome=SlotOutcome.SKIPPED_SUPERSEDED, reason="superseded", claims_slot=True),
    ):
        assert decide_calendar(other, excluded) == other
    assert asked == []


def test_a_slot_of_a_schedule_with_a_calendar_is_fired_alone() -> None:
    t0 = datetime(2026, 12, 24, 18, tzinfo=UTC)
    cadence = Cadence(cron=None, every_s=3600, timezone="UTC", anchor=t0)
    state = ScheduleState(ScheduleStatus.ACTIVE, 0, None, t0)
    schedules = {
        "plain": BatchSchedule(state, cadence, Overlap.ALLOW),
        "closed": BatchSchedule(state, cadence, Overlap.ALLOW, has_calendar=True),
    }
    due = t0 + timedelta(hours=1)
    batch = [Fire("plain", due, Trigger.INTERVAL), Fire("closed", due, Trigger.INTERVAL)]
    plan = decide_batchable(batch, schedules, now=due)
    assert plan.together == (0,) and plan.alone == {1: Alone.CALENDAR}
