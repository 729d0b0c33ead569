"""State names; each value is exactly what the database stores. In the base layer: the domain
decides in them, the tables (:mod:`models`) store them."""

from __future__ import annotations

from enum import StrEnum


class ScheduleStatus(StrEnum):
    ACTIVE = "active"
    PAUSED = "paused"
    DONE = "done"
    DEAD = "dead"


class ExecutionStatus(StrEnum):
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self is not ExecutionStatus.IN_PROGRESS


class WorkerTaskStatus(StrEnum):
    WAITING = "waiting_for_previous_step"
    #: Its group is under way, but a shared limit it uses has no room: a row, holding no message.
    WAITING_FOR_LIMIT = "waiting_for_limit"
    QUEUED = "queued"
    PROCESSING = "processing"


class ActivityStatus(StrEnum):
    IN_PROGRESS = "in_progress"
    COMPLETE = "complete"
    COMPLETE_WITH_WARNING = "complete_with_warning"
    COMPLETE_WITH_ERROR = "complete_with_error"
    FAILED_WITH_ERROR = "failed_with_error"
    CANCELLED = "cancelled"

    @property
    def failed(self) -> bool:
        """Whether this outcome stops a group whose step does not allow ``continue_on_failure``."""
        return self in _FAILED_ACTIVITY


_FAILED_ACTIVITY = frozenset(
    {ActivityStatus.COMPLETE_WITH_ERROR, ActivityStatus.FAILED_WITH_ERROR, ActivityStatus.CANCELLED}
)


class Trigger(StrEnum):
    CRON = "cron"
    INTERVAL = "interval"
    MANUAL = "manual"
    RETRY = "retry"
    BACKFILL = "backfill"


class Overlap(StrEnum):
    SKIP = "skip"
    BUFFER_ONE = "buffer_one"
    CANCEL_PREVIOUS = "cancel_previous"
    ALLOW = "allow"


class ScheduleSource(StrEnum):
    """Where a schedule's definition came from; the schedule file only prunes its own."""

    API = "api"
    FILE = "file"


class SlotOutcome(StrEnum):
    """What became of one due time of a schedule."""

    FIRED = "fired"
    SKIPPED_OVERLAP = "skipped_overlap"
    SKIPPED_PAUSED = "skipped_paused"
    #: The fire came after a newer slot was already due or fired (downtime, a backlog of fire
    #: messages): the newer slot runs instead, so a backlog makes no make-up runs.
    SKIPPED_SUPERSEDED = "skipped_superseded"
    #: No fire message for the slot was ever processed (beat, Redis or the workers were down, or
    #: the message was lost with a killed worker); recorded by the next slot's fire. No make-up run.
    MISSED = "missed"
    #: The slot's day is excluded by the schedule's calendar (``on_excluded: skip``): nothing ran.
    SKIPPED_CALENDAR = "skipped_calendar"
    #: The slot's day is excluded (``on_excluded: next_business_day``): its run waits for the same
    #: wall time on the next business day; the detail says when.
    MOVED = "moved"
    BUFFERED = "buffered"
    RETRY = "retry"


class AuditSource(StrEnum):
    """Who asked for a change: another service's task, the CLI, the dashboard, or beat itself."""

    SERVICE = "service"
    CLI = "cli"
    WEB = "web"
    BEAT = "beat"


class AuditAction(StrEnum):
    """What an audit row records; operators' actions and beat's own decisions alike."""

    APPLY = "apply"
    ROLLBACK = "rollback"
    DELETE = "delete"
    PAUSE = "pause"
    RESUME = "resume"
    TRIGGER = "trigger"
    CANCEL = "cancel"
    RERUN = "rerun"
    FILE_APPLIED = "file_applied"
    RETRY_SCHEDULED = "retry_scheduled"
    DEAD = "dead"
    DONE = "done"
    TIMED_OUT = "timed_out"
    CANCELLED_BY_OVERLAP = "cancelled_by_overlap"
    LOGIN_FAILED = "login_failed"
    LOCKED_OUT = "locked_out"
    ALERT_ACKNOWLEDGED = "alert_acknowledged"
    SILENCED = "silenced"
    UNSILENCED = "unsilenced"
    ALERT_TEST = "alert_test"
    LIMIT_APPLIED = "limit_applied"
    LIMIT_DELETED = "limit_deleted"


class AlertKind(StrEnum):
    """What an alert reports. The first four are what a definition's ``alerts.on`` may name."""

    FAILED = "failed"
    DEAD = "dead"
    MISSED = "missed"
    LATE = "late"
    #: A run that was late has ended; sent wherever its ``late`` alert went.
    RESOLVED = "resolved"
    #: ``chordbeat alerts test CHANNEL``: checks a deployment's wiring.
    TEST = "test"
    #: A shared limit's oldest waiter has waited longer than its ``max_wait``; delivered where
    #: the waiting run's schedule sends its ``late`` alerts (docs/limits.md).
    STARVED = "starved"


class DeliveryStatus(StrEnum):
    """Where one alert's delivery to one channel stands."""

    PENDING = "pending"
    DELIVERED = "delivered"
    #: Held back by the channel's rate limit and sent inside a summary message instead.
    SUMMARISED = "summarised"
    #: Given up after the retry period; ``last_error`` says why.
    FAILED = "failed"


class BackfillStatus(StrEnum):
    """Where a backfill (or a catch-up's make-up runs) stands."""

    #: Slots are left to start, or its runs are in progress.
    RUNNING = "running"
    #: Every slot started and every run ended.
    COMPLETED = "completed"
    #: Cancelled: slots not started by then never start.
    CANCELLED = "cancelled"


class BackfillOrigin(StrEnum):
    """Who asked for a backfill's runs."""

    #: ``chordbeat.backfill_schedule``, the CLI or the dashboard: runs have trigger ``backfill``.
    REQUEST = "request"
    #: A schedule's ``catchup: all`` after missed slots: runs keep the schedule's own trigger.
    CATCHUP = "catchup"
    #: A slot its business calendar excluded, moved to the next business day
    #: (``on_excluded: next_business_day``): its run waits for ``not_before``.
    MOVED = "moved"
