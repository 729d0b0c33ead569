"""Pure decision logic: what a fire does, what happens after a step group, and when retrying.

No I/O here; the firing and lifecycle modules feed these functions what they read (under the
schedule's row lock) and apply what they say with compare-and-set updates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from celeryapp.cadence import Cadence
from celeryapp.definition import StepSpec
from celeryapp.views import iso
from models.states import ActivityStatus, ScheduleStatus, SlotOutcome, Trigger

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


# --- firing -----------------------------------------------------------------------------------

#: A retry's fire message carries the retry's due time; within this much it is the pending retry
#: (beat's entry stores the time as a float, which can be a microsecond off).
SAME_INSTANT = timedelta(milliseconds=1)


@dataclass(frozen=True)
class ScheduleState:
    """The schedule row's state, as read under its row lock."""

    status: ScheduleStatus
    #: Number of the retry pending or running (0: none since the last success).
    current_retry: int
    #: When retry ``current_retry`` is due.
    retry_at: datetime | None
    #: The newest regular slot whose fire was processed.
    last_slot_at: datetime | None = None


@dataclass(frozen=True)
class FireDecision:
    """What one fire message does."""

    #: Start a run (for a retry fire: the pending retry's run).
    start: bool = False
    #: The slot's outcome to record when nothing starts; ``None`` records nothing.
    outcome: SlotOutcome | None = None
    #: Why nothing starts: the fire's ``skipped`` answer and the slot record's detail.
    reason: str | None = None
    #: A regular slot's fire was processed: the schedule's last slot moves up to it.
    claims_slot: bool = False


def decide_fire(
    state: ScheduleState, *, trigger: Trigger, nominal_at: datetime, now: datetime, cadence: Cadence
) -> FireDecision:
    """What the fire of ``nominal_at`` does.

    A regular slot runs only while it is the schedule's latest: once the slot after it is due
    (downtime, fire messages queued while no worker ran) a newer fire exists or beat sends one,
    so a backlog of fires makes one run, not one per missed slot.
    """
    if state.status is not ScheduleStatus.ACTIVE:
        if state.status is ScheduleStatus.PAUSED:
            # Pause is non-destructive: a fire message already on its way does nothing.
            return FireDecision(outcome=SlotOutcome.SKIPPED_PAUSED, reason="schedule is paused")
        return FireDecision(reason=f"schedule is {state.status.value}")
    if trigger is Trigger.RETRY:
        if state.retry_at is None:
            # A run succeeded since the retry was planned (a manual one, say): nothing to retry.
            return FireDecision(reason="no retry is pending")
        if abs(nominal_at - state.retry_at) >= SAME_INSTANT:
            # A late fire of an earlier retry: the pending one has a fire of its own.
            return FireDecision(reason=f"retry {state.current_retry} is due at {iso(state.retry_at)}")
        return FireDecision(start=True)
    if state.last_slot_at is not None and nominal_at <= state.last_slot_at:
        if nominal_at == state.last_slot_at:
            return FireDecision(reason="duplicate")
        return FireDecision(
            outcome=SlotOutcome.SKIPPED_SUPERSEDED,
            reason=f"superseded: the slot at {iso(state.last_slot_at)} was fired after it",
        )
    following = cadence.slot_after(nominal_at)
    if now >= following:
        return FireDecision(
            outcome=SlotOutcome.SKIPPED_SUPERSEDED,
            reason=f"superseded: the slot at {iso(following)} is already due",
            claims_slot=True,
        )
    if state.retry_at is not None:
        return FireDecision(
            outcome=SlotOutcome.RETRY,
            reason=f"retry {state.current_retry} is pending; it replaces this run",
            claims_slot=True,
        )
    return FireDecision(start=True, claims_slot=True)
