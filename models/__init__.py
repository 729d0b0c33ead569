"""Database models: typed SQLAlchemy 2 tables, state enums and transactions."""

from models.base import Base, utcnow
from models.session import get_engine, transaction
from models.states import (
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
from models.tables import (
    Activity,
    AuditEvent,
    MetricCount,
    Schedule,
    ScheduleExecution,
    ScheduleStep,
    SlotRecord,
    WorkerTask,
)

__all__ = [
    "Activity",
    "ActivityStatus",
    "AuditAction",
    "AuditEvent",
    "AuditSource",
    "Base",
    "ExecutionStatus",
    "MetricCount",
    "Overlap",
    "Schedule",
    "ScheduleExecution",
    "ScheduleSource",
    "ScheduleStatus",
    "ScheduleStep",
    "SlotOutcome",
    "SlotRecord",
    "Trigger",
    "WorkerTask",
    "WorkerTaskStatus",
    "get_engine",
    "transaction",
    "utcnow",
]
