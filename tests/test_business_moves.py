"""Where ``on_excluded: next_business_day`` moves a slot's run (pure): worked cases with the 2026
England and Wales bank holidays, DST on the day moved to, and properties over random calendars."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

from hypothesis import given, settings
from hypothesis import strategies as st

from celeryapp.domain.business_moves import extra_slots, moved_from, moved_to
from celeryapp.domain.calendars import WEEKEND, Calendar
from celeryapp.domain.cron import CronExpression
from celeryapp.domain.dst_rules import DstRules, Missing

LONDON = ZoneInfo("Europe/London")
JERUSALEM = ZoneInfo("Asia/Jerusalem")
#: Christmas (Friday) and the substitute Boxing Day (Monday 28th).
UK = Calendar.of([date(2026, 12, 25), date(2026, 12, 28)])


def at(text: str, zone: ZoneInfo = LONDON) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=zone).astimezone(UTC)


def test_a_weekday_schedule_runs_on_the_next_business_day_as_that_days_own_slot() -> None:
    payroll = CronExpression.parse("0 18 * * 1-5")
    # Friday's run moves past the weekend and Monday's holiday to Tuesday 18:00...
    assert moved_to(at("2026-12-25T18:00"), LONDON, UK, None) == at("2026-12-29T18:00")
    assert moved_to(at("2026-12-28T18:00"), LONDON, UK, None) == at("2026-12-29T18:00")
    # ...where the schedule runs anyway: one run, which both excluded slots moved to.
    assert moved_from(at("2026-12-29T18:00"), LONDON, UK, payroll, None) == [
        at("2026-12-25T18:00"),
        at("2026-12-28T18:00"),
    ]
    assert moved_from(at("2026-12-30T18:00"), LONDON, UK, payroll, None) == []
    assert extra_slots(payroll, LONDON, UK, None, at("2026-12-20T00:00"), at("2027-01-10T00:00")) == []


def test_a_monthly_schedule_gets_a_slot_of_its_own_on_the_day_moved_to() -> None:
    monthly = CronExpression.parse("0 9 25,28 * *")
    assert moved_to(at("2026-12-25T09:00"), LONDON, UK, None) == at("2026-12-29T09:00")
    assert extra_slots(monthly, LONDON, UK, None, at("2026-12-01T00:00"), at("2027-01-31T00:00")) == [
        at("2026-12-29T09:00")
    ]
    assert moved_from(at("2026-12-29T09:00"), LONDON, UK, monthly, None) == [
        at("2026-12-25T09:00"),
        at("2026-12-28T09:00"),
    ]
    # The window is (since, until]; the slot itself is not moved anywhere on an ordinary day.
    assert extra_slots(monthly, LONDON, UK, None, at("2026-12-29T09:00"), at("2027-01-31T00:00")) == []


def test_a_weekend_only_schedule_moves_to_monday() -> None:
    saturdays = CronExpression.parse("0 10 * * 6")
    calendar = Calendar.of([date(2026, 12, 26)])
    assert moved_to(at("2026-12-26T10:00"), LONDON, calendar, None) == at("2026-12-28T10:00")
    assert extra_slots(saturdays, LONDON, calendar, None, at("2026-12-20T00:00"), at("2027-01-10T00:00")) == [
        at("2026-12-28T10:00")
    ]


def test_the_day_moved_to_may_be_a_dst_change() -> None:
    # Israel moves its clocks on a Friday: 27 March 2026, 02:00 -> 03:00.
    calendar = Calendar.of([date(2026, 3, 26)])
    slot = at("2026-03-26T02:30", JERUSALEM)
    assert moved_to(slot, JERUSALEM, calendar, None) == at("2026-03-27T03:00", JERUSALEM)
    assert moved_to(slot, JERUSALEM, calendar, DstRules(missing=Missing.SKIP)) is None
    monthly = CronExpression.parse("30 2 26 * *")
    window = at("2026-03-01T00:00", JERUSALEM), at("2026-04-30T00:00", JERUSALEM)
    assert extra_slots(monthly, JERUSALEM, calendar, None, *window) == [at("2026-03-27T03:00", JERUSALEM)]
    assert extra_slots(monthly, JERUSALEM, calendar, DstRules(missing=Missing.SKIP), *window) == []


CRONS = ("0 18 * * 1-5", "30 9 * * *", "0 10 * * 6", "15 7 1,15,25 * *", "0 12 * * 0,3")
START = date(2026, 11, 1)


@settings(derandomize=True, max_examples=200, deadline=None)
@given(st.sampled_from(CRONS), st.sets(st.integers(0, 59), max_size=25))
def test_moves_are_to_the_first_business_day_and_both_directions_agree(cron: str, offsets: set[int]) -> None:
    calendar = Calendar.of(START + timedelta(days=n) for n in offsets)
    expression = CronExpression.parse(cron)
    since, until = at("2026-10-31T00:00"), at("2027-01-31T00:00")
    slots = []
    t = since
    while (t := expression.next_after(t, LONDON)) <= at("2026-12-31T00:00"):
        slots.append(t)
    expected_extra = set()
    for slot in slots:
        day = slot.astimezone(LONDON).date()
        if day not in calendar.reasons:
            continue
        moved = moved_to(slot, LONDON, calendar, None)
        assert moved is not None
        target = moved.astimezone(LONDON)
        assert target.time() == slot.astimezone(LONDON).time()
        between = [day + timedelta(days=n) for n in range(1, (target.date() - day).days)]
        assert target.weekday() not in WEEKEND and target.date() not in calendar.reasons
        assert all(d.weekday() in WEEKEND or d in calendar.reasons for d in between)
        assert slot in moved_from(moved, LONDON, calendar, expression, None)
        assert all(
            moved_to(s, LONDON, calendar, None) == moved for s in moved_from(moved, LONDON, calendar, expression, None)
        )
        if not expression.fires_on(target.date()):
            expected_extra.add(moved)
    found = extra_slots(expression, LONDON, calendar, None, since, until)
    assert found == sorted(expected_extra)
