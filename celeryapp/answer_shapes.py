"""What the service tasks answer, as other services see them: the shapes of the objects and lists
their calls return (:mod:`celeryapp.contract` names the calls, their parameters and refusals).

Standard library only: :mod:`celeryapp.client` imports it, and a caller needs nothing but ``celery``.
Timestamps are ISO 8601 strings in UTC (``"2026-11-21T02:00:00.012Z"``) or ``None``.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


class ScheduleJson(TypedDict):
    """A schedule object: its definition plus its state."""

    name: str
    #: Exactly one of ``cron`` and ``every`` is present.
    cron: NotRequired[str]
    every: NotRequired[float]
    timezone: str
    enabled: bool
    overlap: str
    max_retries: int
    retry_delay: float
    total_repeats: int
    timeout: float | None
    payload: dict[str, Any]
    #: ``{"start_within", "finish_within", "finish_by"}`` (those given) or null.
    deadlines: dict[str, Any] | None
    #: ``{"channels": [...], "on": [...]}`` or null.
    alerts: dict[str, Any] | None
    calendar: dict[str, Any] | None  # {"exclude": [dates], "calendars": [names], "on_excluded"} or null
    #: ``{"policy"}``, with ``"window"`` and ``"max_runs"`` for ``all``; null: ``latest``.
    catchup: dict[str, Any] | None
    #: ``{"repeated", "missing"}`` (either may be absent); null: the default DST rule.
    dst: dict[str, Any] | None
    #: Step groups: a step object, or a list of step objects run in parallel.
    steps: list[Any]
    status: str
    run_count: int
    error_count: int
    current_retry: int
    last_error: str | None
    last_run_at: str | None
    next_run_at: str | None
    #: Who paused it, why (null when not said) and when; all null unless paused.
    paused_by: str | None
    paused_reason: str | None
    paused_at: str | None
    #: The silence in force (``chordbeat.silence_schedule``): ``{"until", "by", "reason"}``, or null.
    silenced: SilencedJson | None
    #: Its alerts nobody acknowledged (not silenced, not a ``resolved`` notice or a test).
    open_alerts: int
    #: The definition's version (docs/versions.md): 1 for its first, one more for each change.
    version: int
    #: Its kept runs of every trigger by how they ended, ``{"total", "completed", "failed",
    #: "cancelled", "running"}``: the count the dashboard and ``chordbeat show`` print. Only in
    #: ``get_schedule``'s answer (a count over the schedule's runs), not in a list's or a change's.
    runs: NotRequired[dict[str, int]]


class SilencedJson(TypedDict):
    """The silence in force on a schedule, as its schedule object shows it."""

    until: str
    by: str
    reason: str | None


class ActivityJson(TypedDict):
    """One attempt of one step of an execution."""

    step_index: int
    step: str
    status: str
    attempt: int
    started_at: str | None
    completed_at: str | None
    error: str | None
    message: str | None
    worker: str | None
    #: A failed attempt's traceback, and the attempt's last log lines (both bounded); or null.
    traceback: str | None
    log_tail: str | None


class WorkerTaskJson(TypedDict):
    """A step of an execution that has not finished yet."""

    step_index: int
    step: str
    status: str
    attempt: int


class _ExecutionFields(TypedDict):
    """What an execution object and an execution summary both carry."""

    id: int
    schedule: str
    status: str
    trigger: str
    run_key: str
    current_step_index: int
    started_at: str | None
    completed_at: str | None
    #: In a summary, cut to 1,000 characters. A cancelled run's reads
    #: ``cancelled by <actor> (<source>)``, then ``: <reason>`` when one was given.
    error: str | None
    #: A re-run's source execution and the step group it started from (0: all); else null.
    rerun_of: int | None
    rerun_from_group: int | None
    #: The nominal time the run is for (a backfill's or catch-up's slot, a retry's due time); null
    #: for a manual run and for runs started before the field existed.
    slot: str | None
    #: The definition version the run runs, pinned at its start; null for runs started before
    #: versions existed.
    version: int | None


class ExecutionJson(_ExecutionFields):
    """An execution object."""

    payload: dict[str, Any] | None
    activities: list[ActivityJson]
    tasks: list[WorkerTaskJson]
    #: The run's step names by group, in the definition's order (a re-run's: its source's plan);
    #: a re-run's groups before ``rerun_from_group`` are taken from ``rerun_of``, not run again.
    groups: NotRequired[list[list[str]]]


class ExecutionSummaryJson(_ExecutionFields):
    """An execution as lists show it: the execution object without ``activities``, ``tasks``,
    ``payload`` and ``groups``, plus ``steps``."""

    #: ``{"total": <steps in the plan>, "<activity status>": <steps whose latest attempt has it>}``;
    #: steps not started yet count in ``total`` only; a re-run's total counts the groups it runs.
    steps: dict[str, int]


class BackfillAnswerJson(TypedDict):
    """``backfill_schedule``'s answer."""

    backfill_id: int | None
    slots: list[str]
    count: int
    #: Why no slot is to run (with the range in the schedule's zone); null when there are slots.
    none_because: NotRequired[str | None]


class BackfillJson(TypedDict):
    """A backfill (or catch-up) and how far it got."""

    id: int
    schedule: str
    #: ``request`` or ``catchup``.
    origin: str
    mode: str
    #: ``running``, ``completed`` or ``cancelled``.
    status: str
    start: str
    end: str
    first_slot: str | None
    last_slot: str | None
    #: The slot that starts next; null once all started.
    next_slot: str | None
    max_concurrent: int
    total: int
    #: Slots started or passed over (``skipped``: their run key had a run already).
    started: int
    running: int
    completed: int
    failed: int
    cancelled: int
    skipped: int
    actor: str | None
    reason: str | None
    created_at: str
    finished_at: str | None


class SlotJson(TypedDict):
    """What became of one due time of a schedule."""

    schedule: str
    nominal_at: str | None
    trigger: str
    outcome: str
    execution_id: int | None
    detail: str | None
    recorded_at: str | None
    #: The due time is before the schedule was created (a backfill of history).
    before_schedule: NotRequired[bool]


class DeliveryJson(TypedDict):
    """One alert's delivery to one channel."""

    channel: str
    #: ``pending``, ``delivered``, ``summarised`` or ``failed``.
    status: str
    attempts: int
    last_error: str | None
    delivered_at: str | None
    next_try_at: str | None


class AlertJson(TypedDict):
    """One alert: what happened, and where it was sent."""

    #: The stable id receivers de-duplicate on: ``<kind>/<schedule>/<slot>``.
    id: str
    #: ``failed``, ``dead``, ``missed``, ``late``, ``resolved`` or ``test``.
    kind: str
    detail: str | None
    schedule: str | None
    slot: str | None
    execution_id: int | None
    message: str
    at: str
    expected_at: str | None
    silenced: bool
    acknowledged_by: str | None
    acknowledged_at: str | None
    deliveries: list[DeliveryJson]


class SilenceJson(TypedDict):
    """A schedule's silence: no alert of it is sent until ``silenced_until``."""

    schedule: str
    silenced_until: str | None
    silenced_by: str | None
    reason: str | None
    changed: NotRequired[bool]


class AuditJson(TypedDict):
    """Who did what: one operator action or one of beat's own decisions."""

    id: int
    at: str
    actor: str
    #: ``service``, ``cli``, ``web`` or ``beat``.
    source: str
    #: ``apply``, ``delete``, ``pause``, ``resume``, ``trigger``, ``cancel``, ``rerun``, and beat's
    #: ``file_applied``, ``retry_scheduled``, ``dead``, ``done``, ``timed_out``, ``cancelled_by_overlap``
    #: (every value: ``celeryapp.states.AuditAction``).
    action: str
    schedule: str | None
    execution_id: int | None
    reason: str | None
    #: What else a reader needs (what an apply changed, a retry's time), or null.
    detail: dict[str, Any] | None


class TriggerJson(TypedDict):
    """The answer to a trigger: the execution started, or why none was."""

    execution_id: int | None
    #: ``"in_progress"`` when an execution started.
    status: NotRequired[str]
    #: The reason nothing started.
    skipped: NotRequired[str]


class DeletedJson(TypedDict):
    name: str
    deleted: bool
