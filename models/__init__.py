"""Database models: typed SQLAlchemy 2 tables and transactions, with the state names they store
(:mod:`celeryapp.states`, in the base layer: the domain decides in them without the database)."""

from celeryapp.states import (
    ActivityStatus,
    AlertKind,
    AuditAction,
    AuditSource,
    BackfillOrigin,
    BackfillStatus,
    DeliveryStatus,
    ExecutionStatus,
    Overlap,
    ScheduleSource,
    ScheduleStatus,
    SlotOutcome,
    Trigger,
    WorkerTaskStatus,
)
from models.alert_tables import Alert, AlertDelivery, AlertSilence
from models.backfill_tables import Backfill
from models.base import Base, utcnow
from models.limit_tables import Limit, LimitHold, LimitWaiter
from models.session import get_engine, transaction
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
from models.version_tables import ScheduleVersion

__all__ = [
    "Activity",
    "ActivityStatus",
    "Alert",
    "AlertDelivery",
    "AlertKind",
    "AlertSilence",
    "AuditAction",
    "AuditEvent",
    "AuditSource",
    "Backfill",
    "BackfillOrigin",
    "BackfillStatus",
    "Base",
    "DeliveryStatus",
    "ExecutionStatus",
    "Limit",
    "LimitHold",
    "LimitWaiter",
    "MetricCount",
    "Overlap",
    "Schedule",
    "ScheduleExecution",
    "ScheduleSource",
    "ScheduleStatus",
    "ScheduleStep",
    "ScheduleVersion",
    "SlotOutcome",
    "SlotRecord",
    "Trigger",
    "WorkerTask",
    "WorkerTaskStatus",
    "get_engine",
    "transaction",
    "utcnow",
]
