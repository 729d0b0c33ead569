"""The shapes of the service tasks' answers, as other services see them.

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
    #: Step groups: a step object, or a list of step objects run in parallel.
    steps: list[Any]
    status: str
    run_count: int
    error_count: int
    current_retry: int
    last_error: str | None
    last_run_at: str | None
    next_run_at: str | None


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


class WorkerTaskJson(TypedDict):
    """A step of an execution that has not finished yet."""

    step_index: int
    step: str
    status: str
    attempt: int


class ExecutionJson(TypedDict):
    """An execution object."""

    id: int
    schedule: str
    status: str
    trigger: str
    run_key: str
    current_step_index: int
    started_at: str | None
    completed_at: str | None
    error: str | None
    payload: dict[str, Any] | None
    #: Only in lists, when the payload was left out for its size.
    payload_omitted_bytes: NotRequired[int]
    activities: list[ActivityJson]
    tasks: list[WorkerTaskJson]


class SlotJson(TypedDict):
    """What became of one due time of a schedule."""

    schedule: str
    nominal_at: str | None
    trigger: str
    outcome: str
    execution_id: int | None
    detail: str | None
    recorded_at: str | None


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
