"""Catch-up policies, pure: the ``catchup`` field read from hostile JSON, every mistake at once;
which missed slots an ``all`` catch-up runs (hypothesis against a brute-force walk); when a
``none`` schedule's slot is too late to run."""

from __future__ import annotations

import itertools
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celeryapp.domain.batching import Alone, BatchSchedule, Fire, decide_batchable
from celeryapp.domain.cadence import Cadence
from celeryapp.domain.catchup import (
    MAX_EXCLUDED_PASSED,
    CatchupPolicy,
    CatchupRules,
    made_up_detail,
    make_up_slots,
    missed_detail,
    too_late,
)
from celeryapp.domain.decisions import FireDecision, ScheduleState, decide_late
from celeryapp.domain.times import span
from celeryapp.domain.validation import parse_definition
from celeryapp.errors import DefinitionError
from celeryapp.scheduling.schedule_file import load_file
from celeryapp.states import Overlap, ScheduleStatus, SlotOutcome, Trigger

BASE = {"name": "nightly", "cron": "0 2 * * *", "steps": [{"name": "s", "task": "tests.tasks.noop"}]}
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def parsed(catchup: Any) -> CatchupRules | None:
    return parse_definition({**BASE, "catchup": catchup}).catchup


def problems(catchup: Any) -> dict[str, str]:
    with pytest.raises(DefinitionError) as caught:
        parsed(catchup)
    return {error.field: error.reason for error in caught.value.errors}


@pytest.mark.parametrize(
    ("given", "rules"),
    [
        (None, None),
        ({"policy": "latest"}, CatchupRules(CatchupPolicy.LATEST)),
        ({"policy": "none"}, CatchupRules(CatchupPolicy.NONE)),
        ({"policy": "none", "window": None}, CatchupRules(CatchupPolicy.NONE)),
        ({"policy": "all"}, CatchupRules(CatchupPolicy.ALL, 86400.0, 10)),
        ({"policy": "all", "window": 3600, "max_runs": 2}, CatchupRules(CatchupPolicy.ALL, 3600.0, 2)),
        ({"policy": "all", "window": 1.5, "max_runs": 1000}, CatchupRules(CatchupPolicy.ALL, 1.5, 1000)),
        ({"policy": "all", "window": 366 * 86400}, CatchupRules(CatchupPolicy.ALL, 366 * 86400.0, 10)),
    ],
)
def test_a_catchup_reads_back_as_written_and_round_trips(given: Any, rules: CatchupRules | None) -> None:
    assert parsed(given) == rules
    definition = parse_definition({**BASE, "catchup": given})
    shown = definition.to_json()["catchup"]
    assert shown == (None if rules is None else rules.to_json())
    # What the schedule object shows is what a re-apply gives back, unchanged.
    assert parse_definition({**BASE, "catchup": shown}) == definition
    assert CatchupRules.from_json(shown) == rules


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("all", {"catchup": "must be an object, got string"}),
        ([], {"catchup": "must be an object, got list"}),
        ({}, {"catchup.policy": "is required"}),
        ({"policy": "sometimes"}, {"catchup.policy": "must be one of latest, none, all, got 'sometimes'"}),
        ({"policy": True}, {"catchup.policy": "got boolean"}),
        ({"policy": "ALL"}, {"catchup.policy": "got 'ALL'"}),
        ({"policy": "x" * 10_000}, {"catchup.policy": "must be one of"}),
        ({"policy": "latest", "window": 60}, {"catchup.window": "is for policy 'all' only (policy is 'latest')"}),
        ({"policy": "none", "max_runs": 3}, {"catchup.max_runs": "is for policy 'all' only (policy is 'none')"}),
        ({"policy": "all", "window": math.nan}, {"catchup.window": "got NaN"}),
        ({"policy": "all", "window": math.inf}, {"catchup.window": "must be between"}),
        ({"policy": "all", "window": 0}, {"catchup.window": "must be between 1 and 31622400 seconds"}),
        ({"policy": "all", "window": -5}, {"catchup.window": "must be between"}),
        ({"policy": "all", "window": 366 * 86400 + 1}, {"catchup.window": "must be between"}),
        ({"policy": "all", "window": 10**400}, {"catchup.window": "must be between"}),
        ({"policy": "all", "window": "3600"}, {"catchup.window": "must be a number of seconds, got string"}),
        ({"policy": "all", "window": True}, {"catchup.window": "got boolean"}),
        ({"policy": "all", "max_runs": 0}, {"catchup.max_runs": "must be between 1 and 1000, got 0"}),
        ({"policy": "all", "max_runs": 1001}, {"catchup.max_runs": "got 1001"}),
        ({"policy": "all", "max_runs": 2.5}, {"catchup.max_runs": "must be an integer, got float"}),
        ({"policy": "all", "max_runs": False}, {"catchup.max_runs": "must be an integer, got boolean"}),
        ({"policy": "all", "max_runs": "2"}, {"catchup.max_runs": "must be an integer, got string"}),
        ({"policy": "all", "extra": 1}, {"catchup.extra": "unknown field (allowed: max_runs, policy, window)"}),
    ],
)
def test_a_bad_catchup_is_refused_naming_the_field(given: Any, expected: dict[str, str]) -> None:
    found = problems(given)
    assert set(found) == set(expected), found
    for field, reason in expected.items():
        assert reason in found[field]


def test_every_catchup_mistake_is_reported_at_once() -> None:
    found = problems({"policy": "bogus", "window": math.nan, "max_runs": 0, "why": 1})
    assert set(found) == {"catchup.policy", "catchup.window", "catchup.max_runs", "catchup.why"}
    found = problems({"policy": "none", "window": 1, "max_runs": 1})
    assert set(found) == {"catchup.window", "catchup.max_runs"}


# --- none: a slot fired too late ---------------------------------------------------------------

NONE = CatchupRules(CatchupPolicy.NONE)
SLOT = datetime(2026, 3, 1, 2, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("rules", "late_s", "reason"),
    [
        (NONE, 121.0, "not run: fired 2 min 1 s late; catchup: none"),
        (NONE, 3.5, None),  # within the grace: on time
        (NONE, 120.0, None),  # exactly the grace: still on time
        (None, 3600.0, None),  # latest runs whatever the delay
        (CatchupRules(CatchupPolicy.LATEST), 3600.0, None),
        (CatchupRules(CatchupPolicy.ALL, 60.0, 1), 3600.0, None),
    ],
)
def test_only_a_none_slot_fired_past_the_grace_is_too_late(
    rules: CatchupRules | None, late_s: float, reason: str | None
) -> None:
    assert too_late(rules, nominal_at=SLOT, now=SLOT + timedelta(seconds=late_s), grace_s=120.0) == reason


def test_a_late_none_slot_is_claimed_and_recorded_missed_and_other_decisions_stand() -> None:
    start = FireDecision(start=True, claims_slot=True)
    assert decide_late(start, "late") == FireDecision(outcome=SlotOutcome.MISSED, reason="late", claims_slot=True)
    assert decide_late(start, None) is start
    # A retry (no slot), a pending retry's slot, a calendar skip: what they were.
    for other in (
        FireDecision(start=True),
        FireDecision(outcome=SlotOutcome.RETRY, reason="retry pending", claims_slot=True),
        FireDecision(outcome=SlotOutcome.SKIPPED_CALENDAR, reason="holiday", claims_slot=True),
    ):
        assert decide_late(other, "late") is other


# --- all: which missed slots run ---------------------------------------------------------------

CADENCES = st.one_of(
    st.one_of(st.integers(min_value=1, max_value=5), st.integers(min_value=1, max_value=7200)).map(
        lambda every: Cadence(cron=None, every_s=float(every), timezone="UTC", anchor=EPOCH)
    ),
    st.sampled_from(
        ["*/5 * * * *", "0 * * * *", "30 2 * * *", "0 9 * * 1-5", "15 1,2,3 * * *", "* 9 * * *", "0 2 1 * *"]
    ).flatmap(
        lambda cron: st.sampled_from(["UTC", "Europe/London", "America/New_York"]).map(
            lambda zone: Cadence(cron=cron, every_s=None, timezone=zone, anchor=EPOCH)
        )
    ),
)


def every_slot(cadence: Cadence, since: datetime, until: datetime) -> list[datetime]:
    """Brute force: each slot strictly between ``since`` and ``until``."""
    slots, more = cadence.slots_between(since, until, 500_000)
    assert not more
    return [slot for slot in slots if slot < until]


@settings(max_examples=300, deadline=None)
@given(
    cadence=CADENCES,
    since_s=st.integers(min_value=0, max_value=30 * 86400),
    gap_s=st.integers(min_value=1, max_value=90 * 86400),
    after_s=st.integers(min_value=0, max_value=3600),
    window_s=st.integers(min_value=1, max_value=4 * 86400),
    max_runs=st.integers(min_value=1, max_value=30),
    excluded_hours=st.sets(st.integers(min_value=0, max_value=23), max_size=6),
)
def test_all_makes_up_the_newest_missed_slots_in_the_window_oldest_first(
    cadence: Cadence,
    since_s: int,
    gap_s: int,
    after_s: int,
    window_s: int,
    max_runs: int,
    excluded_hours: set[int],
) -> None:
    since = EPOCH + timedelta(seconds=since_s)
    until = since + timedelta(seconds=gap_s)
    now = until + timedelta(seconds=after_s)
    rules = CatchupRules(CatchupPolicy.ALL, float(window_s), max_runs)

    def excluded(slot: datetime) -> str | None:
        return "closed" if slot.hour in excluded_hours else None

    chosen = make_up_slots(cadence, rules, between=(since, until), now=now, excluded=excluded)
    # Newest first, as far as the bound on excluded slots passed over allows.
    candidates: list[datetime] = []
    passed = 0
    # From a second before the window (not from ``since``): a day of 1 s slots is enough.
    for slot in reversed(every_slot(cadence, max(since, now - timedelta(seconds=window_s + 1)), until)):
        if now - slot > timedelta(seconds=window_s) or len(candidates) == max_runs:
            break
        if excluded(slot) is None:
            candidates.insert(0, slot)
        else:
            passed += 1
            if passed > MAX_EXCLUDED_PASSED:
                break
    assert list(chosen) == candidates[-max_runs:]
    assert len(chosen) <= max_runs
    assert all(a < b for a, b in itertools.pairwise(chosen)), "oldest first, each once"
    assert all(since < slot < until for slot in chosen)
    # Every missed slot not made up says why: older than the window, or beyond max_runs.
    missed = every_slot(cadence, max(since, now - timedelta(seconds=window_s + 3600)), until)
    for slot in missed[:5] + missed[-max_runs - 5 :]:
        detail = missed_detail(rules, slot, now=now)
        if now - slot > timedelta(seconds=window_s):
            assert detail.endswith(f"not made up: older than catchup.window ({span(window_s)})")
        elif slot not in chosen:
            assert excluded(slot) or detail.endswith(f"older than the newest {max_runs} (catchup.max_runs)")


@given(cadence=CADENCES, gap_s=st.integers(min_value=1, max_value=3 * 86400))
def test_latest_and_none_make_up_nothing(cadence: Cadence, gap_s: int) -> None:
    until = EPOCH + timedelta(seconds=gap_s)
    for rules in (None, CatchupRules(CatchupPolicy.LATEST), NONE):
        assert make_up_slots(cadence, rules, between=(EPOCH, until), now=until, excluded=lambda _: None) == ()


def test_all_after_a_year_down_looks_up_only_what_it_runs() -> None:
    calls = 0
    cadence = Cadence(cron="* * * * *", every_s=None, timezone="UTC", anchor=EPOCH)

    def excluded(_: datetime) -> None:
        nonlocal calls
        calls += 1

    until = EPOCH + timedelta(days=365)
    rules = CatchupRules(CatchupPolicy.ALL, 366 * 86400.0, 5)
    chosen = make_up_slots(cadence, rules, between=(EPOCH, until), now=until, excluded=excluded)
    assert chosen == tuple(until - timedelta(minutes=n) for n in (5, 4, 3, 2, 1))
    assert calls == 5


def test_all_passes_over_a_bounded_number_of_excluded_slots() -> None:
    cadence = Cadence(cron=None, every_s=1.0, timezone="UTC", anchor=EPOCH)
    until = EPOCH + timedelta(days=1)
    rules = CatchupRules(CatchupPolicy.ALL, 86400.0, 5)
    asked: list[datetime] = []

    def everything(slot: datetime) -> str:
        asked.append(slot)
        return "closed"

    assert make_up_slots(cadence, rules, between=(EPOCH, until), now=until, excluded=everything) == ()
    assert len(asked) == 1001


def test_the_records_say_what_became_of_each_missed_slot() -> None:
    now = SLOT + timedelta(hours=2)
    rules = CatchupRules(CatchupPolicy.ALL, 3600.0, 2)
    assert missed_detail(None, SLOT, now=now).endswith("; no make-up run")
    assert missed_detail(NONE, SLOT, now=now).endswith("; no make-up run")
    assert missed_detail(rules, SLOT, now=now).endswith("not made up: older than catchup.window (1 h)")
    assert missed_detail(rules, now - timedelta(minutes=5), now=now).endswith(
        "not made up: older than the newest 2 (catchup.max_runs)"
    )
    assert made_up_detail(7) == "missed; made up by catch-up #7"


def test_a_schedule_file_takes_catchup_and_names_the_schedule_of_a_bad_one(tmp_path: Path) -> None:
    path = tmp_path / "schedules.yaml"
    path.write_text(
        "schedules:\n"
        "  - name: reports\n    cron: '0 6 * * *'\n    catchup: {policy: all, window: 7200, max_runs: 3}\n"
        "    steps: [{name: s, task: tests.tasks.noop}]\n"
        "  - name: quiet\n    every: 60\n    catchup:\n      policy: none\n"
        "    steps: [{name: s, task: tests.tasks.noop}]\n"
    )
    reports, quiet = load_file(path, rules=None)
    assert reports.catchup == CatchupRules(CatchupPolicy.ALL, 7200.0, 3)
    assert quiet.catchup == NONE
    path.write_text(
        "schedules:\n  - name: quiet\n    every: 60\n    catchup: {policy: none, max_runs: .nan}\n"
        "    steps: [{name: s, task: tests.tasks.noop}]\n"
    )
    with pytest.raises(DefinitionError) as caught:
        load_file(path, rules=None)
    assert [error.field for error in caught.value.errors] == ["schedules[0] (quiet).catchup.max_runs"]


def test_a_batch_sends_a_late_slot_of_a_none_schedule_to_the_fire_alone() -> None:
    cadence = Cadence(cron=None, every_s=60.0, timezone="UTC", anchor=EPOCH)
    state = ScheduleState(ScheduleStatus.ACTIVE, 0, None, SLOT - timedelta(seconds=60))
    fires = [Fire(name, SLOT, Trigger.INTERVAL) for name in ("strict", "easy")]
    found = {
        "strict": BatchSchedule(state, cadence, Overlap.ALLOW, late_after_s=2.0),
        "easy": BatchSchedule(state, cadence, Overlap.ALLOW),
    }
    late = decide_batchable(fires, found, now=SLOT + timedelta(seconds=2.5))
    assert late.together == (1,) and late.alone == {0: Alone.LATE}
    on_time = decide_batchable(fires, found, now=SLOT + timedelta(seconds=2))
    assert on_time.together == (0, 1) and not on_time.alone
