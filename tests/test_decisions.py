"""Pure decision logic, no I/O."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from celeryapp.domain.cadence import Cadence
from celeryapp.domain.decisions import (
    AfterExecution,
    FireDecision,
    GroupOutcome,
    NextRun,
    OverlapAction,
    OverlapDecision,
    RetryPolicy,
    ScheduleState,
    StepResult,
    Verdict,
    decide_after_execution,
    decide_after_group,
    decide_fire,
    decide_overlap,
    retry_delay_s,
)
from celeryapp.domain.definition import StepSpec
from celeryapp.states import ActivityStatus as A
from celeryapp.states import ExecutionStatus, Overlap, ScheduleStatus, SlotOutcome, Trigger

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


def test_a_lost_attempt_runs_again_while_attempts_are_left() -> None:
    from datetime import UTC, datetime, timedelta

    from celeryapp.domain.decisions import decide_lost_attempt

    now = datetime(2026, 1, 1, tzinfo=UTC)
    started = now - timedelta(seconds=5)
    again = decide_lost_attempt(1, 3, started_at=started, timeout_s=None, now=now, reason="worker lost")
    assert (again.requeue, again.error) == (True, "worker lost")
    last = decide_lost_attempt(3, 3, started_at=started, timeout_s=None, now=now, reason="worker lost")
    assert (last.requeue, last.error) == (False, "worker lost")
    # Lost after its timeout: the hard kill (or an ignored interrupt), so it timed out.
    late = decide_lost_attempt(1, 3, started_at=started, timeout_s=5, now=now, reason="worker lost")
    assert (late.requeue, late.error) == (False, "timed out after 5s")
    early = decide_lost_attempt(1, 3, started_at=started, timeout_s=5.5, now=now, reason="worker lost")
    assert early.requeue


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


def test_a_late_fire_of_a_slot_decided_already_records_nothing_new_once_paused() -> None:
    """A later slot's fire recorded this one missed; the schedule was paused before this late fire
    came: it is superseded (recorded only if no record exists), not a second record, paused.
    Chaos seed 102 recorded one slot `missed` and `skipped_paused`."""
    paused = replace(ACTIVE, status=ScheduleStatus.PAUSED, last_slot_at=at(120))
    late = fire(paused, at(60), at(121))
    assert late.outcome is SlotOutcome.SKIPPED_SUPERSEDED and not late.start and not late.claims_slot
    assert fire(paused, at(120), at(121)) == FireDecision(reason="duplicate")
    assert fire(paused, at(180), at(181)).outcome is SlotOutcome.SKIPPED_PAUSED


# --- after an execution -----------------------------------------------------------------------

POLICY = RetryPolicy(max_retries=2, total_repeats=0, retry_base_s=60)


def after(
    state: ScheduleState,
    ended: ExecutionStatus,
    *,
    is_pending_retry: bool = False,
    started: bool = False,
    buffered: bool = False,
    policy: RetryPolicy = POLICY,
    run_count: int = 1,
    now: datetime = T0,
) -> AfterExecution:
    return decide_after_execution(
        state,
        policy,
        ended=ended,
        is_pending_retry=is_pending_retry,
        pending_retry_started=started or is_pending_retry,
        run_count=run_count,
        buffered=buffered,
        now=now,
    )


def test_a_failure_schedules_retries_with_backoff_then_the_schedule_dies() -> None:
    first = after(ACTIVE, ExecutionStatus.FAILED)
    assert first == AfterExecution(1, at(60), ScheduleStatus.ACTIVE, counted=True)
    second = after(replace(ACTIVE, current_retry=1, retry_at=at(60)), ExecutionStatus.FAILED, is_pending_retry=True)
    assert second == AfterExecution(2, at(120), ScheduleStatus.ACTIVE, counted=True)
    last = after(replace(ACTIVE, current_retry=2, retry_at=at(120)), ExecutionStatus.FAILED, is_pending_retry=True)
    assert last == AfterExecution(2, None, ScheduleStatus.DEAD, counted=True)


def test_without_retries_failures_never_kill_the_schedule() -> None:
    no_retries = RetryPolicy(max_retries=0, total_repeats=0, retry_base_s=60)
    assert after(ACTIVE, ExecutionStatus.FAILED, policy=no_retries) == AfterExecution(0, None, ScheduleStatus.ACTIVE)


def test_one_retry_at_a_time_other_runs_failures_add_none() -> None:
    pending = replace(ACTIVE, current_retry=1, retry_at=at(60))
    # Overlapping `allow` runs (or a manual run) failing while retry 1 is pending or running.
    for _ in range(3):
        assert after(pending, ExecutionStatus.FAILED, now=at(10)) == AfterExecution(1, at(60), ScheduleStatus.ACTIVE)
    # At the last retry too: they do not make the schedule dead.
    last = replace(ACTIVE, current_retry=2, retry_at=at(120))
    assert after(last, ExecutionStatus.FAILED, started=True).status is ScheduleStatus.ACTIVE


def test_success_resets_retries_and_total_repeats_ends_the_schedule() -> None:
    pending = replace(ACTIVE, current_retry=1, retry_at=at(60))
    assert after(pending, ExecutionStatus.COMPLETED) == AfterExecution(0, None, ScheduleStatus.ACTIVE)
    twice = RetryPolicy(max_retries=0, total_repeats=2, retry_base_s=60)
    assert after(ACTIVE, ExecutionStatus.COMPLETED, policy=twice, run_count=1).status is ScheduleStatus.ACTIVE
    assert after(ACTIVE, ExecutionStatus.COMPLETED, policy=twice, run_count=2).status is ScheduleStatus.DONE


def test_a_cancelled_retry_has_had_its_run_and_the_next_failure_moves_on() -> None:
    running = replace(ACTIVE, current_retry=1, retry_at=at(60))
    cancelled = after(running, ExecutionStatus.CANCELLED, is_pending_retry=True, now=at(61))
    assert cancelled == AfterExecution(1, None, ScheduleStatus.ACTIVE)
    next_failure = after(replace(ACTIVE, current_retry=1), ExecutionStatus.FAILED, now=at(100))
    assert next_failure == AfterExecution(2, at(220), ScheduleStatus.ACTIVE, counted=True)


def test_an_overdue_retry_that_never_ran_starts_when_a_run_ends() -> None:
    overdue = replace(ACTIVE, current_retry=1, retry_at=at(60))
    # The retry's fire met a manual run in progress; the manual run is cancelled.
    assert after(overdue, ExecutionStatus.CANCELLED, now=at(70)).start is NextRun.RETRY
    # ... or fails: no retry is added, the pending one starts.
    failed = after(overdue, ExecutionStatus.FAILED, now=at(70))
    assert failed == AfterExecution(1, at(60), ScheduleStatus.ACTIVE, start=NextRun.RETRY)
    # Not yet due, or already started: nothing starts.
    assert after(overdue, ExecutionStatus.CANCELLED, now=at(59)).start is None
    assert after(overdue, ExecutionStatus.CANCELLED, started=True, now=at(70)).start is None


def test_a_buffered_run_starts_when_no_retry_is_pending() -> None:
    assert after(ACTIVE, ExecutionStatus.COMPLETED, buffered=True).start is NextRun.BUFFERED
    assert after(ACTIVE, ExecutionStatus.CANCELLED, buffered=True).start is NextRun.BUFFERED
    # The run failed and a retry is due later: the retry goes first, the buffered run waits.
    assert after(ACTIVE, ExecutionStatus.FAILED, buffered=True).start is None
    dead = after(replace(ACTIVE, current_retry=2, retry_at=at(0)), ExecutionStatus.FAILED, is_pending_retry=True)
    assert dead.status is ScheduleStatus.DEAD and dead.start is None


# --- overlap ----------------------------------------------------------------------------------

EVERY_CASE = [
    (overlap, trigger, lost_race, active_id)
    for overlap in Overlap
    for trigger in Trigger
    for lost_race in (False, True)
    for active_id in (7, None)
]
STARTS = {OverlapAction.START, OverlapAction.CANCEL_AND_START}


@pytest.mark.parametrize(("overlap", "trigger", "lost_race", "active_id"), EVERY_CASE)
def test_every_overlap_case_obeys_the_policy(
    overlap: Overlap, trigger: Trigger, lost_race: bool, active_id: int | None
) -> None:
    decision = decide_overlap(overlap, trigger, active_id=active_id, current_retry=2, lost_race=lost_race)
    if lost_race:
        # The winner just started: it is neither cancelled nor run beside.
        assert decision.action not in STARTS
    elif overlap is Overlap.ALLOW:
        assert decision.action is OverlapAction.START
    elif overlap is Overlap.CANCEL_PREVIOUS:
        assert decision.action is OverlapAction.CANCEL_AND_START
    if decision.action not in STARTS:
        # A retry is never skipped or buffered away: it waits for the active run's end.
        expected = {
            Trigger.RETRY: OverlapAction.RETRY_WAITS,
        }.get(trigger, OverlapAction.BUFFER if overlap is Overlap.BUFFER_ONE else OverlapAction.SKIP)
        assert decision.action is expected
        running = "execution 7" if active_id == 7 else "another execution"
        assert decision.outcome is not None
        assert decision.detail is not None and decision.detail.startswith(f"{running} is in progress")
        assert decision.skipped is not None and decision.skipped.endswith(f"{running} is in progress")
    else:
        assert (decision.outcome, decision.detail, decision.skipped) == (None, None, None)


def test_overlap_decisions_record_and_answer_as_before() -> None:
    assert decide_overlap(Overlap.SKIP, Trigger.CRON, active_id=3, current_retry=0) == OverlapDecision(
        OverlapAction.SKIP,
        SlotOutcome.SKIPPED_OVERLAP,
        "execution 3 is in progress",
        "overlap: execution 3 is in progress",
    )
    assert decide_overlap(Overlap.BUFFER_ONE, Trigger.INTERVAL, active_id=3, current_retry=0) == OverlapDecision(
        OverlapAction.BUFFER,
        SlotOutcome.BUFFERED,
        "execution 3 is in progress; runs when it ends",
        "buffered: execution 3 is in progress",
    )
    assert decide_overlap(Overlap.SKIP, Trigger.RETRY, active_id=None, current_retry=2, lost_race=True) == (
        OverlapDecision(
            OverlapAction.RETRY_WAITS,
            SlotOutcome.BUFFERED,
            "another execution is in progress; retry 2 runs when it ends",
            "retry waits: another execution is in progress",
        )
    )
    assert decide_overlap(Overlap.CANCEL_PREVIOUS, Trigger.MANUAL, active_id=None, current_retry=0, lost_race=True) == (
        OverlapDecision(
            OverlapAction.SKIP,
            SlotOutcome.SKIPPED_OVERLAP,
            "another execution is in progress",
            "overlap: another execution is in progress",
        )
    )


@pytest.mark.parametrize("overlap", [Overlap.SKIP, Overlap.BUFFER_ONE, Overlap.CANCEL_PREVIOUS])
@pytest.mark.parametrize("trigger", [Trigger.CRON, Trigger.INTERVAL, Trigger.MANUAL])
def test_a_run_meeting_a_backfill_run_waits_for_it_whatever_the_policy(overlap: Overlap, trigger: Trigger) -> None:
    """A backfill never costs a regular slot its run, and is never cancelled by one."""
    assert decide_overlap(overlap, trigger, active_id=7, current_retry=0, backfill_run=7) == OverlapDecision(
        OverlapAction.BUFFER,
        SlotOutcome.BUFFERED,
        "waiting for backfill run #7",
        "buffered: backfill run 7 is in progress",
    )
    # A retry waits for it too (cancel_previous would otherwise cancel it).
    assert decide_overlap(overlap, Trigger.RETRY, active_id=7, current_retry=1, backfill_run=7) == OverlapDecision(
        OverlapAction.RETRY_WAITS,
        SlotOutcome.BUFFERED,
        "backfill run 7 is in progress; retry 1 runs when it ends",
        "retry waits: backfill run 7 is in progress",
    )
