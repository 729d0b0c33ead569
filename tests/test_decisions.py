"""Pure decision logic, no I/O."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from celeryapp.cadence import Cadence
from celeryapp.decisions import (
    FireDecision,
    GroupOutcome,
    ScheduleState,
    StepResult,
    Verdict,
    decide_after_group,
    decide_fire,
    retry_delay_s,
)
from celeryapp.definition import StepSpec
from models.states import ActivityStatus as A
from models.states import ScheduleStatus, SlotOutcome, Trigger

STRICT = StepSpec("strict", "t")
LENIENT = StepSpec("lenient", "t", continue_on_failure=True)


def decide(results: dict[str, StepResult], *, unfinished: int = 0, has_next: bool = True) -> GroupOutcome:
    return decide_after_group([STRICT, LENIENT], results, unfinished=unfinished, has_next_group=has_next)


def test_all_complete_advances_or_completes() -> None:
    ok = {"strict": StepResult(A.COMPLETE), "lenient": StepResult(A.COMPLETE_WITH_WARNING)}
    assert decide(ok) == GroupOutcome(Verdict.ADVANCE)
    assert decide(ok, has_next=False) == GroupOutcome(Verdict.COMPLETE)


def test_unfinished_tasks_make_it_wait_whatever_was_recorded() -> None:
    assert decide({"strict": StepResult(A.FAILED_WITH_ERROR, "x")}, unfinished=1).verdict is Verdict.WAIT


@pytest.mark.parametrize("status", [A.FAILED_WITH_ERROR, A.COMPLETE_WITH_ERROR, A.CANCELLED])
def test_a_failing_strict_step_fails_the_run_naming_it(status: A) -> None:
    outcome = decide({"strict": StepResult(status, "boom"), "lenient": StepResult(A.COMPLETE)})
    assert outcome.verdict is Verdict.FAIL
    assert outcome.error is not None and outcome.error.startswith("step 'strict'") and outcome.error.endswith("boom")


def test_a_failing_lenient_step_does_not_stop_the_run() -> None:
    outcome = decide({"strict": StepResult(A.COMPLETE), "lenient": StepResult(A.FAILED_WITH_ERROR, "boom")})
    assert outcome.verdict is Verdict.ADVANCE


def test_a_step_without_any_outcome_counts_as_failed() -> None:
    outcome = decide({"lenient": StepResult(A.COMPLETE)})
    assert outcome.verdict is Verdict.FAIL and "no outcome was recorded" in (outcome.error or "")


@pytest.mark.parametrize(
    ("base", "retry", "delay"),
    [(60, 1, 60), (60, 2, 120), (60, 3, 240), (60, 4, 480), (60, 5, 600), (60, 9, 600), (300, 3, 1200), (300, 5, 3000)],
)
def test_backoff_doubles_and_caps_at_ten_times_the_base(base: float, retry: int, delay: float) -> None:
    assert retry_delay_s(base, retry) == delay


def test_retry_numbers_start_at_one() -> None:
    with pytest.raises(ValueError):
        retry_delay_s(60, 0)


# --- firing -----------------------------------------------------------------------------------

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
MINUTELY = Cadence(cron=None, every_s=60, timezone="UTC", anchor=T0)
ACTIVE = ScheduleState(ScheduleStatus.ACTIVE, current_retry=0, retry_at=None)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def fire(state: ScheduleState, nominal: datetime, now: datetime, trigger: Trigger = Trigger.INTERVAL) -> FireDecision:
    return decide_fire(state, trigger=trigger, nominal_at=nominal, now=now, cadence=MINUTELY)


def test_a_fresh_slot_starts_and_claims_the_slot() -> None:
    assert fire(ACTIVE, at(60), at(60.2)) == FireDecision(start=True, claims_slot=True)
    # Late, but still before the next slot: it is the latest slot, so it runs.
    assert fire(ACTIVE, at(60), at(119.9)).start


def test_a_fire_processed_once_the_next_slot_is_due_is_superseded() -> None:
    decision = fire(ACTIVE, at(60), at(120))
    assert not decision.start and decision.outcome is SlotOutcome.SKIPPED_SUPERSEDED and decision.claims_slot
    assert decision.reason == "superseded: the slot at 2026-11-21T12:02:00.000Z is already due"


def test_an_older_slot_than_one_already_fired_is_superseded_and_the_same_slot_is_a_duplicate() -> None:
    state = replace(ACTIVE, last_slot_at=at(120))
    older = fire(state, at(60), at(120.5))
    assert older.outcome is SlotOutcome.SKIPPED_SUPERSEDED and not older.start and not older.claims_slot
    assert fire(state, at(120), at(120.5)) == FireDecision(reason="duplicate")
    assert fire(state, at(180), at(180.1)) == FireDecision(start=True, claims_slot=True)


def test_a_pending_retry_replaces_a_regular_slot() -> None:
    state = replace(ACTIVE, current_retry=1, retry_at=at(90))
    decision = fire(state, at(60), at(60.1))
    assert decision.outcome is SlotOutcome.RETRY and not decision.start and decision.claims_slot
    assert decision.reason == "retry 1 is pending; it replaces this run"


def test_a_retry_fire_starts_only_the_pending_retry() -> None:
    pending = replace(ACTIVE, current_retry=2, retry_at=at(90))
    assert fire(pending, at(90), at(500), Trigger.RETRY) == FireDecision(start=True)
    # The entry stores the time as a float: a microsecond off is still the same retry.
    assert fire(pending, at(90.000001), at(500), Trigger.RETRY).start
    stale = fire(pending, at(30), at(500), Trigger.RETRY)
    assert not stale.start and stale.outcome is None and stale.reason == "retry 2 is due at 2026-11-21T12:01:30.000Z"
    assert fire(ACTIVE, at(90), at(91), Trigger.RETRY) == FireDecision(reason="no retry is pending")


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (ScheduleStatus.PAUSED, FireDecision(outcome=SlotOutcome.SKIPPED_PAUSED, reason="schedule is paused")),
        (ScheduleStatus.DONE, FireDecision(reason="schedule is done")),
        (ScheduleStatus.DEAD, FireDecision(reason="schedule is dead")),
    ],
)
def test_an_inactive_schedule_starts_nothing(status: ScheduleStatus, expected: FireDecision) -> None:
    assert fire(replace(ACTIVE, status=status), at(60), at(60.1)) == expected
