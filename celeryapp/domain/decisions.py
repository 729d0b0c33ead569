"""Pure decision logic: what a fire does, what a run meeting an active one does (overlap), what
happens after a step group and after an execution.

No I/O here; the firing and lifecycle modules feed these functions what they read (under the
schedule's row lock) and apply what they say with compare-and-set updates.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from celeryapp.domain.cadence import Cadence, retry_delay_s
from celeryapp.domain.definition import StepSpec
from celeryapp.domain.times import iso
from celeryapp.states import ActivityStatus, ExecutionStatus, Overlap, ScheduleStatus, SlotOutcome, Trigger


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
    #: When retry ``current_retry`` is due; set until that retry's run ends.
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
    #: Where its business calendar moved the slot's run (``on_excluded: next_business_day``).
    moved_to: datetime | None = None


def decide_fire(
    state: ScheduleState, *, trigger: Trigger, nominal_at: datetime, now: datetime, cadence: Cadence
) -> FireDecision:
    """What the fire of ``nominal_at`` does.

    A regular slot runs only while it is the schedule's latest: once the slot after it is due
    (downtime, fire messages queued while no worker ran) a newer fire exists or beat sends one,
    so a backlog of fires makes one run, not one per missed slot.
    """
    if trigger is not Trigger.RETRY and state.last_slot_at is not None and nominal_at <= state.last_slot_at:
        # Decided already, whatever the schedule's state now: a later fire processed before this
        # one recorded the slot (missed), and a pause since must not record it a second time.
        if nominal_at == state.last_slot_at:
            return FireDecision(reason="duplicate")
        return FireDecision(
            outcome=SlotOutcome.SKIPPED_SUPERSEDED,
            reason=f"superseded: the slot at {iso(state.last_slot_at)} was fired after it",
        )
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


def decide_late(decision: FireDecision, reason: str | None) -> FireDecision:
    """A regular slot that would start but fired too late for its ``catchup: none`` policy
    (``reason``, from :func:`celeryapp.domain.catchup.too_late`) starts nothing: the slot is
    claimed and recorded missed. Any other decision stands."""
    if reason is None or not (decision.start and decision.claims_slot):
        return decision
    return FireDecision(outcome=SlotOutcome.MISSED, reason=reason, claims_slot=True)


def decide_calendar(
    decision: FireDecision,
    excluded: Callable[[], str | None],
    move: Callable[[], datetime | str] | None = None,
) -> FireDecision:
    """A regular slot that would start a run on a day its business calendar excludes starts
    nothing: the slot is claimed and recorded ``skipped_calendar``. ``excluded`` says why (``None``:
    not excluded), asked only of a slot that would start (it reads the calendar's files). A slot
    that starts nothing anyway keeps its own outcome; a retry is no slot and runs.

    ``move`` (``on_excluded: next_business_day``) says where the run moves, or why it cannot (no
    business day within the search, or the DST rule skips that wall time): moved, the slot is
    recorded ``moved`` and its run waits for that time; else it is skipped, saying why."""
    if not (decision.start and decision.claims_slot):
        return decision
    reason = excluded()
    if reason is None:
        return decision
    if move is not None:
        target = move()
        if isinstance(target, datetime):
            return FireDecision(
                outcome=SlotOutcome.MOVED, reason=f"moved to {iso(target)}: {reason}", claims_slot=True, moved_to=target
            )
        reason = f"{reason}; not moved: {target}"
    return FireDecision(outcome=SlotOutcome.SKIPPED_CALENDAR, reason=f"not run: {reason}", claims_slot=True)


# --- overlap ----------------------------------------------------------------------------------


class OverlapAction(StrEnum):
    """What a run that meets an active execution of its schedule does."""

    #: Start alongside it (``overlap: allow``).
    START = "start"
    #: Cancel the active executions, then start (``overlap: cancel_previous``).
    CANCEL_AND_START = "cancel_and_start"
    #: A retry stays pending: the end of the active run starts it.
    RETRY_WAITS = "retry_waits"
    #: Keep one run for when the active one ends (``overlap: buffer_one``), if it is still running.
    BUFFER = "buffer"
    #: Record the skip and do nothing else (``overlap: skip``).
    SKIP = "skip"


@dataclass(frozen=True)
class OverlapDecision:
    action: OverlapAction
    #: The slot record's outcome and detail, and the caller's ``skipped`` answer, when nothing starts.
    outcome: SlotOutcome | None = None
    detail: str | None = None
    skipped: str | None = None


def decide_overlap(
    overlap: Overlap,
    trigger: Trigger,
    *,
    active_id: int | None,
    current_retry: int,
    lost_race: bool = False,
    backfill_run: int | None = None,
) -> OverlapDecision:
    """What a run does when an execution of its exclusive schedule is in progress.

    ``active_id`` is that execution, ``None`` when it is only known to exist: the run lost the
    race for the schedule's one active slot (the unique constraint) to a run that just started,
    which is never cancelled and never run beside.

    ``backfill_run``: the run in progress is a backfill's (or catch-up's). A backfill must never
    cost a regular slot its run, so whatever the policy the slot waits for it (buffered) and runs
    as soon as it ends, before the backfill's next; a retry waits for it too (``cancel_previous``
    cancels no backfill run).
    """
    if backfill_run is not None and trigger is Trigger.RETRY:
        return OverlapDecision(
            OverlapAction.RETRY_WAITS,
            SlotOutcome.BUFFERED,
            f"backfill run {backfill_run} is in progress; retry {current_retry} runs when it ends",
            f"retry waits: backfill run {backfill_run} is in progress",
        )
    if backfill_run is not None:
        return OverlapDecision(
            OverlapAction.BUFFER,
            SlotOutcome.BUFFERED,
            f"waiting for backfill run #{backfill_run}",
            f"buffered: backfill run {backfill_run} is in progress",
        )
    running = f"execution {active_id}" if active_id is not None else "another execution"
    if not lost_race:
        if overlap is Overlap.ALLOW:
            return OverlapDecision(OverlapAction.START)
        if overlap is Overlap.CANCEL_PREVIOUS:
            return OverlapDecision(OverlapAction.CANCEL_AND_START)
    if trigger is Trigger.RETRY:
        return OverlapDecision(
            OverlapAction.RETRY_WAITS,
            SlotOutcome.BUFFERED,
            f"{running} is in progress; retry {current_retry} runs when it ends",
            f"retry waits: {running} is in progress",
        )
    if overlap is Overlap.BUFFER_ONE:
        return OverlapDecision(
            OverlapAction.BUFFER,
            SlotOutcome.BUFFERED,
            f"{running} is in progress; runs when it ends",
            f"buffered: {running} is in progress",
        )
    return OverlapDecision(
        OverlapAction.SKIP,
        SlotOutcome.SKIPPED_OVERLAP,
        f"{running} is in progress",
        f"overlap: {running} is in progress",
    )


# --- after an execution -----------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int
    total_repeats: int
    #: Backoff base in seconds (see :func:`retry_delay_s`).
    retry_base_s: float


class NextRun(StrEnum):
    """A run that starts because the ended one made room for it."""

    #: The pending retry, overdue, waited for the ended run (it met it as an overlap, or its fire
    #: was lost): it starts now.
    RETRY = "retry"
    #: The ``buffer_one`` run kept while the ended one was in progress.
    BUFFERED = "buffered"


@dataclass(frozen=True)
class AfterExecution:
    """The schedule's retry state and status once one of its executions ended, and what starts."""

    current_retry: int
    retry_at: datetime | None
    status: ScheduleStatus
    #: Whether this failure moved the retry counter.
    counted: bool = False
    start: NextRun | None = None


def decide_after_execution(
    state: ScheduleState,
    policy: RetryPolicy,
    *,
    ended: ExecutionStatus,
    is_pending_retry: bool,
    pending_retry_started: bool,
    run_count: int,
    buffered: bool,
    now: datetime,
) -> AfterExecution:
    """Retries, ``done`` and ``dead`` after an execution ended ``ended``.

    One retry at a time: while a retry is pending or running, only that retry's own failure moves
    to the next one; failures of other runs (overlapping ``allow`` runs, manual runs) are counted
    as errors but add no retry. ``is_pending_retry``: the ended run is the pending retry's.
    ``pending_retry_started``: the pending retry's run exists (running or ended).
    """
    retry, retry_at, status = state.current_retry, state.retry_at, state.status
    counted = False
    active = status is ScheduleStatus.ACTIVE
    if ended is ExecutionStatus.COMPLETED:
        retry, retry_at = 0, None
        if active and policy.total_repeats and run_count >= policy.total_repeats:
            status = ScheduleStatus.DONE
    elif ended is ExecutionStatus.FAILED:
        if active and policy.max_retries and (retry_at is None or is_pending_retry):
            counted = True
            if retry < policy.max_retries:
                retry += 1
                retry_at = now + timedelta(seconds=retry_delay_s(policy.retry_base_s, retry))
            else:
                retry_at, status = None, ScheduleStatus.DEAD
    elif is_pending_retry:
        # The retry was cancelled: it has had its run. The failure streak stays, so the next
        # failure schedules the next retry.
        retry_at = None
    start = None
    if status is ScheduleStatus.ACTIVE:
        if retry_at is not None and retry_at <= now and not pending_retry_started:
            start = NextRun.RETRY
        elif buffered and retry_at is None:
            # A pending retry goes first; the buffered run waits for a run that leaves none.
            start = NextRun.BUFFERED
    return AfterExecution(retry, retry_at, status, counted, start)
