"""Pure decision logic, no I/O."""

from __future__ import annotations

import pytest

from celeryapp.decisions import GroupOutcome, StepResult, Verdict, decide_after_group, retry_delay_s
from celeryapp.definition import StepSpec
from models.states import ActivityStatus as A

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

    from celeryapp.decisions import decide_lost_attempt

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
