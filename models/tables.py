"""The tables: schedules and their steps, executions, worker tasks, activities and slots."""

from __future__ import annotations

import secrets
from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    ColumnElement,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
    literal_column,
    or_,
)
from sqlalchemy import Enum as SAEnum
from sqlalchemy.orm import Mapped, mapped_column, relationship

from celeryapp.states import (
    ActivityStatus,
    AuditAction,
    AuditSource,
    ExecutionStatus,
    Overlap,
    ScheduleSource,
    ScheduleStatus,
    SlotOutcome,
    Trigger,
    WorkerTaskStatus,
)
from models.base import Base, UTCDateTime, utcnow

NAME_LENGTH = 200


def enum_column(enum: type[Any], **kw: Any) -> Any:
    # Stored as plain strings (not native enums) so that adding a state is a code change, not
    # an ALTER TYPE; the values are the enums' values.
    return mapped_column(
        SAEnum(
            enum,
            native_enum=False,
            length=32,
            values_callable=lambda e: [m.value for m in e],
            validate_strings=True,
            create_constraint=False,
        ),
        **kw,
    )


class Schedule(Base):
    __tablename__ = "schedules"
    __table_args__ = ({"sqlite_autoincrement": True},)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LENGTH), unique=True)
    source: Mapped[ScheduleSource] = enum_column(ScheduleSource, default=ScheduleSource.API)
    #: For a file-sourced schedule, the file's ``source:`` name: applying a file prunes only the
    #: schedules of its own source, never those another file declared.
    source_name: Mapped[str | None] = mapped_column(String(NAME_LENGTH), default=None)
    status: Mapped[ScheduleStatus] = enum_column(ScheduleStatus, default=ScheduleStatus.ACTIVE)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    cron: Mapped[str | None] = mapped_column(String(200), default=None)
    every_s: Mapped[float | None] = mapped_column(Float, default=None)
    timezone: Mapped[str] = mapped_column(String(64), default="UTC")
    overlap: Mapped[Overlap] = enum_column(Overlap, default=Overlap.SKIP)
    max_retries: Mapped[int] = mapped_column(Integer, default=0)
    retry_delay_s: Mapped[float] = mapped_column(Float, default=60.0)
    total_repeats: Mapped[int] = mapped_column(Integer, default=0)
    timeout_s: Mapped[float | None] = mapped_column(Float, default=None)
    payload: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    #: The definition's ``deadlines`` and ``alerts`` objects as validated; None when not given.
    deadlines: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    alerts: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    #: The definition's ``calendar`` object as validated (its named calendars are files of
    #: ``CHORDBEAT_CALENDARS_DIR``, read when a slot fires); None when not given.
    calendar: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    #: The definition's ``catchup`` and ``dst`` objects as validated; None: the default policies
    #: (``latest``; the DST rule docs/schedules.md states).
    catchup: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    dst: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    #: Shared limits every step of its runs uses, as the definition writes them (None: none).
    uses: Mapped[list[Any] | None] = mapped_column(JSON, default=None)

    run_count: Mapped[int] = mapped_column(Integer, default=0)
    error_count: Mapped[int] = mapped_column(Integer, default=0)
    current_retry: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str | None] = mapped_column(Text, default=None)
    last_run_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    next_run_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    #: The newest regular slot whose fire message was processed; an older slot's fire arriving
    #: later is superseded, so a backlog of fire messages never becomes a burst of make-up runs.
    last_slot_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    #: When retry ``current_retry`` of a failed execution is due; set until that retry's run ends.
    #: While set it replaces the regular cadence.
    retry_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    #: A ``buffer_one`` run waiting for the active execution to end.
    buffered: Mapped[bool] = mapped_column(Boolean, default=False)
    #: Who paused the schedule, why and when; None unless paused.
    paused_by: Mapped[str | None] = mapped_column(String(100), default=None)
    paused_reason: Mapped[str | None] = mapped_column(String(500), default=None)
    paused_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    #: The definition's version (its row in schedule_versions): bumped by every definition change.
    version: Mapped[int] = mapped_column(Integer, default=1)
    #: When something beat's entry depends on last changed (definition, status, pending retry).
    #: The periodic reconcile looks only at schedules changed since its previous pass.
    changed_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    steps: Mapped[list[ScheduleStep]] = relationship(
        back_populates="schedule",
        cascade="all, delete-orphan",
        order_by="(ScheduleStep.step_index, ScheduleStep.position)",
        lazy="selectin",
    )


class ScheduleStep(Base):
    __tablename__ = "schedule_steps"
    __table_args__ = (UniqueConstraint("schedule_id", "name"), {"sqlite_autoincrement": True})

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    schedule_id: Mapped[int] = mapped_column(ForeignKey("schedules.id", ondelete="CASCADE"))
    #: Position of the step's group in the schedule; steps sharing it run in parallel.
    step_index: Mapped[int] = mapped_column(Integer)
    #: Position inside the group, to give the definition back as it was written.
    position: Mapped[int] = mapped_column(Integer, default=0)
    #: Whether the group was written as a list (a one-step list stays a list on the way back).
    in_list: Mapped[bool] = mapped_column(Boolean, default=False)
    name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    task: Mapped[str] = mapped_column(String(NAME_LENGTH))
    args: Mapped[list[Any]] = mapped_column(JSON, default=list)
    kwargs: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    continue_on_failure: Mapped[bool] = mapped_column(Boolean, default=False)
    timeout_s: Mapped[float | None] = mapped_column(Float, default=None)
    queue: Mapped[str | None] = mapped_column(String(NAME_LENGTH), default=None)
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    #: Shared limits the step uses, as the definition writes them (None: none).
    uses: Mapped[list[Any] | None] = mapped_column(JSON, default=None)

    schedule: Mapped[Schedule] = relationship(back_populates="steps")


def run_token() -> int:
    """A run's token: random, never 0 (the token of runs started before it existed)."""
    return secrets.randbelow(RUN_TOKEN_MAX) + 1


#: Run tokens are below this (a positive 32-bit integer on every database).
RUN_TOKEN_MAX = 2**31 - 1


class ScheduleExecution(Base):
    __tablename__ = "schedule_executions"
    __table_args__ = (
        Index("ix_schedule_executions_status_started", "status", "started_at"),
        # A schedule's latest runs (dashboard strips and grid, lists by name): one index range each.
        Index("ix_schedule_executions_schedule_id_id", "schedule_id", "id"),
        Index("ix_schedule_executions_schedule_name_id", "schedule_name", "id"),
        # Housekeeping finds the finished runs past retention without reading the kept ones.
        Index("ix_schedule_executions_completed_at", "completed_at"),
        # The Runs page: newest first by (started_at, id), all runs or one trigger's or one name's.
        Index("ix_schedule_executions_started_at_id", "started_at", "id"),
        Index("ix_schedule_executions_trigger_started", "trigger", "started_at", "id"),
        Index("ix_schedule_executions_schedule_name_started", "schedule_name", "started_at", "id"),
        # One version's runs of a schedule, newest first (``list_executions(version=…)``).
        Index("ix_schedule_executions_schedule_name_version_id", "schedule_name", "version", "id"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    #: Kept when the schedule is deleted (history outlives its schedule); the name stays readable.
    schedule_id: Mapped[int | None] = mapped_column(ForeignKey("schedules.id", ondelete="SET NULL"), default=None)
    schedule_name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    status: Mapped[ExecutionStatus] = enum_column(ExecutionStatus, default=ExecutionStatus.IN_PROGRESS)
    trigger: Mapped[Trigger] = enum_column(Trigger)
    #: Deterministic identity of the run (schedule, nominal slot, retry): one execution per key.
    run_key: Mapped[str] = mapped_column(String(400), unique=True)
    #: Set to the schedule id while a non-``allow`` execution is in progress; the unique constraint
    #: makes "one active execution per schedule" a database guarantee, not a read-then-write race.
    exclusive_key: Mapped[int | None] = mapped_column(Integer, unique=True, default=None)
    current_step_index: Mapped[int] = mapped_column(Integer, default=0)
    #: The step groups as they were when the run started; later edits of the schedule do not
    #: change a run in flight.
    plan: Mapped[list[list[dict[str, Any]]]] = mapped_column(JSON)
    #: Steps in ``plan``, written with it: lists show a run's step count without reading its plan
    #: (up to 256 KB, slow to count a page of: docs/performance.md). ``None`` for runs
    #: started before revision 0007, whose plans are counted.
    step_count: Mapped[int | None] = mapped_column(Integer, default=None)
    payload: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    deadline_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    #: A re-run's source execution, and the group it started from (0: the whole plan).
    rerun_of: Mapped[int | None] = mapped_column(Integer, default=None)
    rerun_from_group: Mapped[int | None] = mapped_column(Integer, default=None)
    #: The nominal time the run is for (its slot; a catch-up or backfill run starts long after
    #: it); None for a manual run and for runs started before revision 0011.
    slot: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    #: The backfill (or catch-up) that started the run; None for the others.
    backfill_id: Mapped[int | None] = mapped_column(Integer, default=None, index=True)
    #: Drawn at random when the run starts (:func:`run_token`): it names the run's Redis keys and
    #: Celery task ids with its id, which a database that went back hands out again. 0 for runs
    #: started before revision 0012 (their keys are named as before).
    token: Mapped[int] = mapped_column(Integer, default=lambda: run_token())
    #: The definition version the run runs (its ``plan`` is that version's steps), pinned at its
    #: start; None for runs started before revision 0017.
    version: Mapped[int | None] = mapped_column(Integer, default=None)


class WorkerTask(Base):
    """A step of an execution that has not finished yet; deleted when it finishes."""

    __tablename__ = "worker_tasks"
    __table_args__ = (
        UniqueConstraint("execution_id", "step_name"),
        Index("ix_worker_tasks_status", "status"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    execution_id: Mapped[int] = mapped_column(ForeignKey("schedule_executions.id", ondelete="CASCADE"))
    step_index: Mapped[int] = mapped_column(Integer)
    step_name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    status: Mapped[WorkerTaskStatus] = enum_column(WorkerTaskStatus)
    #: Attempt the current message belongs to; a message of an older attempt is fenced off.
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    node: Mapped[str | None] = mapped_column(String(NAME_LENGTH), default=None)
    queued_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)


class Activity(Base):
    """Audit row of one attempt of one step; immutable once finished."""

    __tablename__ = "activities"
    __table_args__ = (UniqueConstraint("execution_id", "step_name", "attempt"), {"sqlite_autoincrement": True})

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    # Indexed by the unique constraint, which leads with it.
    execution_id: Mapped[int] = mapped_column(ForeignKey("schedule_executions.id", ondelete="CASCADE"))
    step_index: Mapped[int] = mapped_column(Integer)
    step_name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    attempt: Mapped[int] = mapped_column(Integer)
    status: Mapped[ActivityStatus] = enum_column(ActivityStatus, default=ActivityStatus.IN_PROGRESS)
    worker: Mapped[str | None] = mapped_column(String(NAME_LENGTH), default=None)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    #: Warning text, or a short summary of what the step returned.
    message: Mapped[str | None] = mapped_column(Text, default=None)
    #: A failed attempt's traceback and the attempt's last log lines, both bounded and redacted.
    traceback: Mapped[str | None] = mapped_column(Text, default=None)
    log_tail: Mapped[str | None] = mapped_column(Text, default=None)


class SlotRecord(Base):
    """What happened at one nominal fire time of a schedule, so a missing run has an answer."""

    __tablename__ = "schedule_slots"
    __table_args__ = (
        # A schedule's slot record, newest first.
        Index("ix_schedule_slots_schedule_name_id", "schedule_name", "id"),
        # Whether a slot is recorded already (firing, under the schedule's row lock); and a
        # schedule's delete setting its records' schedule_id to NULL.
        Index("ix_schedule_slots_schedule_id_nominal_at", "schedule_id", "nominal_at"),
        # A deleted execution's slot records (ON DELETE SET NULL), one index probe each.
        Index("ix_schedule_slots_execution_id", "execution_id"),
        Index("ix_schedule_slots_recorded_at", "recorded_at"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    schedule_id: Mapped[int | None] = mapped_column(ForeignKey("schedules.id", ondelete="SET NULL"), default=None)
    schedule_name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    nominal_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    trigger: Mapped[Trigger] = enum_column(Trigger)
    outcome: Mapped[SlotOutcome] = enum_column(SlotOutcome)
    execution_id: Mapped[int | None] = mapped_column(
        ForeignKey("schedule_executions.id", ondelete="SET NULL"), default=None
    )
    detail: Mapped[str | None] = mapped_column(Text, default=None)
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


#: Step attempts that recovery ended (their worker was lost) or that ran out of time: the health
#: page's recent recoveries, found through a partial index holding only these rows. The patterns
#: are literals so that PostgreSQL can match the query to the index's predicate.
RECOVERED_ATTEMPT: ColumnElement[bool] = or_(
    Activity.error.like(literal_column("'worker lost%'")), Activity.error.like(literal_column("'timed out%'"))
)
Index("ix_activities_recovered", Activity.id, postgresql_where=RECOVERED_ATTEMPT, sqlite_where=RECOVERED_ATTEMPT)


class AuditEvent(Base):
    """Who did what: one operator action or one of beat's own decisions. Kept apart from the
    executions (no foreign key to them) so that the trail outlives history housekeeping."""

    __tablename__ = "audit_events"
    __table_args__ = (
        # A schedule's trail, newest first.
        Index("ix_audit_events_schedule_name_id", "schedule_name", "id"),
        # An execution's trail.
        Index("ix_audit_events_execution_id", "execution_id"),
        # Time ranges (the Audit page, ``chordbeat audit --since``) and housekeeping.
        Index("ix_audit_events_at", "at"),
        # The global trail filtered by who or what, newest first.
        Index("ix_audit_events_actor_id", "actor", "id"),
        Index("ix_audit_events_action_id", "action", "id"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    actor: Mapped[str] = mapped_column(String(100))
    source: Mapped[AuditSource] = enum_column(AuditSource)
    action: Mapped[AuditAction] = enum_column(AuditAction)
    schedule_name: Mapped[str | None] = mapped_column(String(NAME_LENGTH), default=None)
    execution_id: Mapped[int | None] = mapped_column(Integer, default=None)
    reason: Mapped[str | None] = mapped_column(String(500), default=None)
    #: What else a reader needs (the changed fields, a retry's time); a small JSON object.
    detail: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)


class MetricCount(Base):
    """A monotonic metric value: a counter, or one bucket of a histogram (count and sum of the
    values that fell in it, not cumulative). Added to in the transaction that records what it
    counts; housekeeping never deletes these, so exported ``*_total`` counters never go down."""

    __tablename__ = "metric_counts"

    metric: Mapped[str] = mapped_column(String(64), primary_key=True)
    #: Empty for metrics not kept per schedule.
    schedule_name: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    #: The status or outcome counted; empty for histograms.
    label: Mapped[str] = mapped_column(String(32), primary_key=True)
    #: A histogram bucket's upper bound ("0.5", "+Inf"); empty for counters.
    bucket: Mapped[str] = mapped_column(String(16), primary_key=True)
    count: Mapped[int] = mapped_column(BigInteger, default=0)
    total: Mapped[float] = mapped_column(Float, default=0.0)


# The tables themselves, for the statements every step, advancement and batch of fires runs: the
# ORM's per-statement work (bulk DML compile state, identity map) costs more there than the statements.
EXECUTIONS = cast(Table, ScheduleExecution.__table__)
WORKER_TASKS = cast(Table, WorkerTask.__table__)
ACTIVITIES = cast(Table, Activity.__table__)
SLOT_RECORDS = cast(Table, SlotRecord.__table__)
AUDIT_EVENTS = cast(Table, AuditEvent.__table__)
SCHEDULES = cast(Table, Schedule.__table__)
SCHEDULE_STEPS = cast(Table, ScheduleStep.__table__)
