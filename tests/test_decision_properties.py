"""Property tests of the decision core: advancement, backoff, retries, and no make-up runs.

Pure functions, so hypothesis drives them over many inputs in milliseconds; the example-based
tests beside them (test_decisions.py) pin the exact answers of the cases that matter most.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celeryapp.domain.cadence import BACKOFF_CAP_FACTOR, Cadence, retry_delay_s
from celeryapp.domain.decisions import (
    NextRun,
    RetryPolicy,
    ScheduleState,
    StepResult,
    Verdict,
    decide_after_execution,
    decide_after_group,
    decide_fire,
)
from celeryapp.domain.definition import StepSpec
from celeryapp.states import ActivityStatus, ExecutionStatus, ScheduleStatus, Trigger

T0 = datetime(2026, 3, 1, tzinfo=UTC)

steps_and_results = st.lists(
    st.tuples(st.booleans(), st.one_of(st.none(), st.sampled_from(list(ActivityStatus)))), min_size=1, max_size=6
)


@given(steps_and_results, st.integers(min_value=0, max_value=3), st.booleans())
def test_a_group_fails_exactly_when_a_step_that_may_not_fail_did(
    spec: list[tuple[bool, ActivityStatus | None]], unfinished: int, has_next: bool
) -> None:
    steps = [StepSpec(name=f"s{i}", task="t", continue_on_failure=c) for i, (c, _) in enumerate(spec)]
    results = {f"s{i}": StepResult(status, "boom") for i, (_, status) in enumerate(spec) if status is not None}
    outcome = decide_after_group(steps, results, unfinished=unfinished, has_next_group=has_next)
    if unfinished:
        assert outcome.verdict is Verdict.WAIT
        return
    # A step without an outcome was lost: a failure. In progress counts as not failed (recorded).
    blocking = [
        s.name
        for s, (may_fail, status) in zip(steps, spec, strict=True)
        if not may_fail and (status is None or status.failed)
    ]
    if blocking:
        assert outcome.verdict is Verdict.FAIL
        assert outcome.error is not None and f"step {blocking[0]!r}" in outcome.error
    else:
        assert outcome.verdict is (Verdict.ADVANCE if has_next else Verdict.COMPLETE)


def test_backoff_waits_as_the_contract_says() -> None:
    """Delay = min(base * 2^(retry-1), base * 10): a minute's base waits 1, 2, 4, 8, then 10 minutes."""
    assert [retry_delay_s(60, retry) for retry in range(1, 8)] == [60, 120, 240, 480, 600, 600, 600]
    assert [retry_delay_s(1.5, retry) for retry in (1, 2, 4, 5, 1000)] == [1.5, 3, 12, 15, 15]
    with pytest.raises(ValueError, match="start at 1"):
        retry_delay_s(60, 0)


@given(st.floats(min_value=1, max_value=7 * 86400), st.integers(min_value=1, max_value=1000))
def test_backoff_starts_at_the_base_doubles_until_ten_times_it_and_stays_there(base: float, retry: int) -> None:
    cap = base * BACKOFF_CAP_FACTOR
    delay, following = retry_delay_s(base, retry), retry_delay_s(base, retry + 1)
    assert retry_delay_s(base, 1) == base
    assert base <= delay <= following <= cap, "grows with each retry, never past the cap"
    if delay == cap:
        assert following == cap, "once capped, it stays"
    elif 2 * delay <= cap:
        assert following == 2 * delay, "below the cap, each retry waits twice the one before"
    else:
        assert following == cap, "the doubling that would pass the cap stops at it"
    if retry >= 5:  # 2^4 = 16 times the base is past ten
        assert delay == cap


outcomes = st.sampled_from([ExecutionStatus.COMPLETED, ExecutionStatus.FAILED, ExecutionStatus.CANCELLED])


@settings(max_examples=300)
@given(
    st.integers(min_value=0, max_value=5),
    st.lists(st.tuples(outcomes, st.booleans()), min_size=1, max_size=30),
)
def test_retries_count_only_the_pending_retrys_own_failures_and_never_exceed_the_limit(
    max_retries: int, runs: list[tuple[ExecutionStatus, bool]]
) -> None:
    """Whatever runs end in whatever order (overlapping ``allow`` runs, manual runs, retries), the
    schedule goes ``dead`` only after ``max_retries`` retries really ran (failed, or cancelled: a
    cancelled retry has had its run) since the last success."""
    policy = RetryPolicy(max_retries=max_retries, total_repeats=0, retry_base_s=60)
    state = ScheduleState(ScheduleStatus.ACTIVE, current_retry=0, retry_at=None)
    now = T0
    retries_failed = 0
    for ended, is_retry_run in runs:
        if state.status is not ScheduleStatus.ACTIVE:
            break
        # Only a run of the pending retry can be the pending retry's.
        is_pending_retry = is_retry_run and state.retry_at is not None
        after = decide_after_execution(
            state,
            policy,
            ended=ended,
            is_pending_retry=is_pending_retry,
            pending_retry_started=is_pending_retry,
            run_count=0,
            buffered=False,
            now=now,
        )
        if ended is not ExecutionStatus.COMPLETED and is_pending_retry:
            retries_failed += 1
        if ended is ExecutionStatus.COMPLETED:
            assert (after.current_retry, after.retry_at) == (0, None)
            retries_failed = 0
        assert 0 <= after.current_retry <= max_retries
        if after.status is ScheduleStatus.DEAD:
            assert max_retries and retries_failed == max_retries, (retries_failed, max_retries)
        if not max_retries:
            assert after.status is ScheduleStatus.ACTIVE and after.retry_at is None
        state = ScheduleState(after.status, after.current_retry, after.retry_at)
        now += timedelta(minutes=1)


@settings(max_examples=300)
@given(
    st.integers(min_value=1, max_value=3600),
    st.lists(st.tuples(st.integers(min_value=0, max_value=40), st.floats(min_value=0, max_value=5000)), max_size=40),
)
def test_fires_in_any_order_start_each_slot_at_most_once_and_only_the_latest_due(
    every: int, fires: list[tuple[int, float]]
) -> None:
    """No make-up runs: however late, duplicated or out of order fire messages are processed, a
    run starts only for a slot that is the latest due when processed, never twice, never for a slot
    older than one already processed."""
    cadence = Cadence(cron=None, every_s=every, timezone="UTC", anchor=T0)
    state = ScheduleState(ScheduleStatus.ACTIVE, current_retry=0, retry_at=None)
    started: list[datetime] = []
    clock = T0
    for index, delay in fires:
        slot = T0 + timedelta(seconds=every * index)
        clock = max(clock, slot + timedelta(seconds=delay))  # processed at or after its slot
        decision = decide_fire(state, trigger=Trigger.INTERVAL, nominal_at=slot, now=clock, cadence=cadence)
        newer = state.last_slot_at is None or slot > state.last_slot_at
        if decision.claims_slot:
            assert newer, "a slot older than the last one processed claimed it"
            state = ScheduleState(state.status, state.current_retry, state.retry_at, last_slot_at=slot)
        if decision.start:
            assert newer and decision.claims_slot
            assert cadence.slot_after(slot) > clock, "a run started for a slot whose next one was due"
            assert slot not in started
            started.append(slot)
    assert started == sorted(started)


@settings(max_examples=500)
@given(
    status=st.sampled_from(ScheduleStatus),
    retry=st.integers(min_value=0, max_value=4),
    retry_in_s=st.none() | st.integers(min_value=-600, max_value=600),
    max_retries=st.integers(min_value=0, max_value=4),
    total_repeats=st.integers(min_value=0, max_value=5),
    run_count=st.integers(min_value=0, max_value=6),
    ended=outcomes,
    is_pending_retry=st.booleans(),
    pending_retry_started=st.booleans(),
    buffered=st.booleans(),
)
def test_after_an_execution_only_an_active_schedule_changes_and_starts_at_most_one_run(
    status: ScheduleStatus,
    retry: int,
    retry_in_s: int | None,
    max_retries: int,
    total_repeats: int,
    run_count: int,
    ended: ExecutionStatus,
    is_pending_retry: bool,
    pending_retry_started: bool,
    buffered: bool,
) -> None:
    retry_at = None if retry_in_s is None else T0 + timedelta(seconds=retry_in_s)
    state = ScheduleState(status, current_retry=min(retry, max_retries), retry_at=retry_at)
    policy = RetryPolicy(max_retries=max_retries, total_repeats=total_repeats, retry_base_s=60)
    after = decide_after_execution(
        state,
        policy,
        ended=ended,
        is_pending_retry=is_pending_retry and retry_at is not None,
        pending_retry_started=pending_retry_started,
        run_count=run_count,
        buffered=buffered,
        now=T0,
    )
    if status is not ScheduleStatus.ACTIVE:
        # Paused, done or dead: its status stays, nothing is counted, nothing starts.
        assert (after.status, after.counted, after.start) == (status, False, None)
    # Repeats: done exactly when an active schedule's success reaches total_repeats.
    done = status is ScheduleStatus.ACTIVE and ended is ExecutionStatus.COMPLETED and 0 < total_repeats <= run_count
    assert (after.status is ScheduleStatus.DONE) == (done or status is ScheduleStatus.DONE)
    if ended is ExecutionStatus.COMPLETED:
        assert (after.current_retry, after.retry_at, after.counted) == (0, None, False)
    if after.counted:
        # A counted failure plans the next retry with its backoff, or, out of retries, kills the schedule.
        if after.status is ScheduleStatus.DEAD:
            assert state.current_retry == max_retries and after.retry_at is None
        else:
            assert after.current_retry == state.current_retry + 1 <= max_retries
            assert after.retry_at == T0 + timedelta(seconds=retry_delay_s(60, after.current_retry))
    elif ended is ExecutionStatus.FAILED:
        assert (after.current_retry, after.retry_at) == (state.current_retry, state.retry_at)
    if after.start is NextRun.RETRY:
        assert after.retry_at is not None and after.retry_at <= T0 and not pending_retry_started
    if after.start is NextRun.BUFFERED:
        assert buffered and after.retry_at is None
    if after.start is not None:
        assert after.status is ScheduleStatus.ACTIVE
