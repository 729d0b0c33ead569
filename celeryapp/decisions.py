"""Pure decision logic: what happens after a step group, after an execution, and when retrying.

No I/O here; the lifecycle module feeds these functions what it read and applies what they say.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from celeryapp.definition import StepSpec
from models.states import ActivityStatus

#: Retry delays never grow past this many times the base delay.
BACKOFF_CAP_FACTOR = 10


class Verdict(StrEnum):
    WAIT = "wait"
    FAIL = "fail"
    ADVANCE = "advance"
    COMPLETE = "complete"


@dataclass(frozen=True)
class GroupOutcome:
    verdict: Verdict
    #: For ``FAIL``: the execution's error, naming the step and the reason.
    error: str | None = None


@dataclass(frozen=True)
class StepResult:
    """The final attempt's outcome of one step."""

    status: ActivityStatus
    error: str | None = None


def decide_after_group(
    steps: Sequence[StepSpec],
    results: Mapping[str, StepResult],
    *,
    unfinished: int,
    has_next_group: bool,
) -> GroupOutcome:
    """What the execution does once the group's chord body (or a re-queued step) reports in.

    ``results`` maps step names to the outcome of their latest attempt; ``unfinished`` counts the
    group's worker tasks still queued or processing (a re-queued attempt, for instance).
    """
    if unfinished:
        return GroupOutcome(Verdict.WAIT)
    for step in steps:
        result = results.get(step.name)
        if result is None:
            # No outcome recorded and no task left: the step was lost, which counts as a failure.
            result = StepResult(ActivityStatus.FAILED_WITH_ERROR, "no outcome was recorded")
        if result.status.failed and not step.continue_on_failure:
            reason = result.error or result.status.value
            return GroupOutcome(Verdict.FAIL, f"step {step.name!r} {_describe(result.status)}: {reason}")
    return GroupOutcome(Verdict.ADVANCE if has_next_group else Verdict.COMPLETE)


def _describe(status: ActivityStatus) -> str:
    return {
        ActivityStatus.CANCELLED: "was cancelled",
        ActivityStatus.COMPLETE_WITH_ERROR: "completed with an error",
    }.get(status, "failed")


def retry_delay_s(base_s: float, retry: int) -> float:
    """Delay before retry number ``retry`` (1-based): min(base·2^(retry-1), base·10)."""
    if retry < 1:
        raise ValueError("retry numbers start at 1")
    return float(min(base_s * 2 ** (retry - 1), base_s * BACKOFF_CAP_FACTOR))


@dataclass(frozen=True)
class LostAttempt:
    """What becomes of a step attempt whose worker is gone."""

    #: Run it again as the next attempt; otherwise the step fails with ``error``.
    requeue: bool
    #: The error recorded on the lost attempt's activity.
    error: str


def decide_lost_attempt(
    attempt: int,
    max_attempts: int,
    *,
    started_at: datetime | None,
    timeout_s: float | None,
    now: datetime,
    reason: str,
) -> LostAttempt:
    """A lost attempt runs again while attempts are left, unless it outlived its timeout: then the
    loss is the timeout's hard kill (or a step that ignored its interrupt), and it timed out."""
    if timeout_s is not None and started_at is not None and now - started_at >= timedelta(seconds=timeout_s):
        return LostAttempt(requeue=False, error=f"timed out after {timeout_s:g}s")
    return LostAttempt(requeue=attempt < max_attempts, error=reason)
