"""The pure part of a backfill: the slots of a range (start ≤ slot < end, oldest first, never more
than the cap, found walking at most cap + 1), the mode's filter, and the names of its runs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celeryapp.domain.backfill_slots import (
    BackfillMode,
    backfill_run_key,
    choose_slots,
    range_slots,
)
from celeryapp.domain.cadence import Cadence
from celeryapp.errors import InvalidArgument

ORIGIN = datetime(2026, 3, 1, tzinfo=UTC)
CADENCES = [
    Cadence(cron="0 * * * *", every_s=None, timezone="UTC", anchor=ORIGIN),
    Cadence(cron="30 2 * * *", every_s=None, timezone="Europe/London", anchor=ORIGIN),
    Cadence(cron="*/7 * * * *", every_s=None, timezone="America/New_York", anchor=ORIGIN),
    Cadence(cron=None, every_s=900.5, timezone="UTC", anchor=ORIGIN + timedelta(microseconds=250)),
]


@settings(max_examples=200, deadline=None)
@given(
    cadence=st.sampled_from(CADENCES),
    start_s=st.integers(min_value=-86_400, max_value=40 * 86_400),
    length_s=st.integers(min_value=1, max_value=30 * 86_400),
    cap=st.integers(min_value=1, max_value=300),
)
def test_range_slots_are_the_cadences_slots_in_the_range_oldest_first_at_most_cap(
    cadence: Cadence, start_s: int, length_s: int, cap: int
) -> None:
    start = ORIGIN + timedelta(seconds=start_s)
    end = start + timedelta(seconds=length_s)
    try:
        slots = range_slots(cadence, start, end, cap)
    except InvalidArgument as refused:
        assert refused.field == "end" and f"more than {cap} slots" in refused.reason
        # Refused only when the range really holds more than cap slots.
        more, _ = cadence.slots_between(start - timedelta(microseconds=1), end - timedelta(microseconds=1), cap + 1)
        assert len(more) == cap + 1
        return
    assert len(slots) <= cap
    assert all(start <= slot < end for slot in slots)
    assert slots == sorted(set(slots))
    # None of the cadence's slots in the range is left out: each follows the one before.
    expected = cadence.slot_after(start - timedelta(microseconds=1))
    for slot in slots:
        assert slot == expected
        expected = cadence.slot_after(slot)
    assert expected >= end


def test_a_century_of_minutes_is_refused_after_walking_cap_plus_one_slots() -> None:
    minutely = Cadence(cron="* * * * *", every_s=None, timezone="UTC", anchor=ORIGIN)
    with pytest.raises(InvalidArgument, match="more than 10000 slots"):
        range_slots(minutely, ORIGIN - timedelta(days=36_500), ORIGIN)


slot_sets = st.sets(st.integers(min_value=0, max_value=40)).map(
    lambda hours: frozenset(ORIGIN + timedelta(hours=h) for h in hours)
)


@given(mode=st.sampled_from(list(BackfillMode)), ran=slot_sets, failed=slot_sets, busy=slot_sets)
def test_the_mode_picks_its_slots_in_order_and_never_a_busy_one(
    mode: BackfillMode, ran: frozenset[datetime], failed: frozenset[datetime], busy: frozenset[datetime]
) -> None:
    slots = [ORIGIN + timedelta(hours=h) for h in range(40)]
    failed = failed & ran  # a slot whose latest run failed has a run
    chosen = choose_slots(slots, mode, ran=ran, latest_failed=failed, busy=busy)
    assert chosen == [s for s in slots if s in set(chosen)]  # order kept
    assert not set(chosen) & busy
    if mode is BackfillMode.MISSING:
        assert set(chosen) == set(slots) - ran - busy
    elif mode is BackfillMode.FAILED:
        assert set(chosen) == (failed & set(slots)) - busy
    else:
        assert set(chosen) == set(slots) - busy


def test_run_keys_repeat_for_a_request_made_twice_and_count_for_failed() -> None:
    slot = datetime(2026, 1, 2, 3, tzinfo=UTC)
    first = backfill_run_key("n", slot, earlier_backfill_runs=0, mode="missing")
    assert first == "n:backfill:2026-01-02T03:00:00.000Z"
    assert backfill_run_key("n", slot, earlier_backfill_runs=3, mode="all") == first
    assert backfill_run_key("n", slot, earlier_backfill_runs=0, mode="failed") == first
    assert backfill_run_key("n", slot, earlier_backfill_runs=1, mode="failed") == first + ":2"
