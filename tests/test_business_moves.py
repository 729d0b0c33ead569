"""Where ``on_excluded: next_business_day`` moves a slot's run (pure): worked cases with the 2026
England and Wales bank holidays, DST on the day moved to, no business day in reach, and a property
over random calendars."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celeryapp.domain.business_moves import moved_to
from celeryapp.domain.calendars import WEEKEND, Calendar, CalendarError
from celeryapp.domain.cron import CronExpression
from celeryapp.domain.dst_rules import DstRules, Missing

LONDON = ZoneInfo("Europe/London")
JERUSALEM = ZoneInfo("Asia/Jerusalem")
#: Christmas (Friday) and the substitute Boxing Day (Monday 28th).
UK = Calendar.of([date(2026, 12, 25), date(2026, 12, 28)])


def at(text: str, zone: ZoneInfo = LONDON) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=zone).astimezone(UTC)


def test_a_weekday_schedule_s_excluded_runs_move_to_the_next_business_day() -> None:
    # Friday's run moves past the weekend and Monday's holiday to Tuesday 18:00, and Monday's
    # there too: each keeps its own run (beside Tuesday's own slot).
    assert moved_to(at("2026-12-25T18:00"), LONDON, UK, None) == at("2026-12-29T18:00")
    assert moved_to(at("2026-12-28T18:00"), LONDON, UK, None) == at("2026-12-29T18:00")


def test_a_weekend_only_schedule_moves_to_monday() -> None:
    calendar = Calendar.of([date(2026, 12, 26)])
    assert moved_to(at("2026-12-26T10:00"), LONDON, calendar, None) == at("2026-12-28T10:00")


def test_the_day_moved_to_may_be_a_dst_change() -> None:
    # Israel moves its clocks on a Friday: 27 March 2026, 02:00 -> 03:00.
    calendar = Calendar.of([date(2026, 3, 26)])
    slot = at("2026-03-26T02:30", JERUSALEM)
    assert moved_to(slot, JERUSALEM, calendar, None) == at("2026-03-27T03:00", JERUSALEM)
    assert moved_to(slot, JERUSALEM, calendar, DstRules(missing=Missing.SKIP)) is None


def test_no_business_day_within_the_search_is_an_error() -> None:
    calendar = Calendar.of(date(2026, 12, 1) + timedelta(days=n) for n in range(400))
    with pytest.raises(CalendarError, match="no business day within 366 days after 2026-12-01"):
        moved_to(at("2026-12-01T09:00"), LONDON, calendar, None)


CRONS = ("0 18 * * 1-5", "30 9 * * *", "0 10 * * 6", "15 7 1,15,25 * *", "0 12 * * 0,3")
START = date(2026, 11, 1)


@settings(derandomize=True, max_examples=200, deadline=None)
@given(st.sampled_from(CRONS), st.sets(st.integers(0, 59), max_size=25))
def test_moves_are_to_the_first_business_day_at_the_same_wall_time(cron: str, offsets: set[int]) -> None:
    calendar = Calendar.of(START + timedelta(days=n) for n in offsets)
    expression = CronExpression.parse(cron)
    t = at("2026-10-31T00:00")
    while (t := expression.next_after(t, LONDON)) <= at("2026-12-31T00:00"):
        day = t.astimezone(LONDON).date()
        if day not in calendar.reasons:
            continue
        moved = moved_to(t, LONDON, calendar, None)
        assert moved is not None
        target = moved.astimezone(LONDON)
        assert target.time() == t.astimezone(LONDON).time()
        between = [day + timedelta(days=n) for n in range(1, (target.date() - day).days)]
        assert target.weekday() not in WEEKEND and target.date() not in calendar.reasons
        assert all(d.weekday() in WEEKEND or d in calendar.reasons for d in between)
