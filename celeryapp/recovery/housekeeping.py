"""Housekeeping: finished executions (with their activities) and slot records past retention go,
and audit rows, alerts (with their deliveries) and ended silences past the trail's own, longer
retention (``CHORDBEAT_AUDIT_RETENTION_DAYS``): an alert is part of who-knew-what-when. A
definition version goes once it is past the trail's retention, no kept run ran it, and it is not
among its schedule's newest ``KEPT_VERSIONS`` (or its schedule was deleted).

One pass at a time across the deployment (a lease in Redis, renewed after every batch), in small
batches that each commit by themselves, oldest first through the indexes on ``completed_at`` and
``recorded_at``, so a pass never reads the history it keeps and never holds a lock a fire, a step
or an advancement waits for longer than one batch. A pass stops after ``PASS_BUDGET_S`` and
leaves the rest to a follow-up pass sent a moment later, so a backlog (retention shortened, a
long outage) never keeps a control thread for long.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from redis.exceptions import LockError
from redis.lock import Lock
from sqlalchemy import Select, delete, exists, select, union_all
from sqlalchemy.orm import Session

from celeryapp.domain.names import PREFIX
from celeryapp.messaging.redis_client import get_redis
from celeryapp.monitoring.metric_counts import retire_orphans
from celeryapp.runtime import Runtime
from models import (
    Alert,
    AlertSilence,
    AuditEvent,
    Backfill,
    ExecutionStatus,
    Schedule,
    ScheduleExecution,
    ScheduleVersion,
    SlotRecord,
    utcnow,
)
from models.session import affected, retried_transaction

logger = logging.getLogger(__name__)

#: Executions deleted per transaction; each takes its step attempts along (ON DELETE CASCADE).
EXECUTION_BATCH = 500
#: Slot records and audit rows deleted per transaction (small rows, nothing refers to them).
SLOT_BATCH = 5_000
#: A pass gives its thread back after this long; what is left goes to the next pass.
PASS_BUDGET_S = 60.0
#: Lifetime of the pass's lease, renewed after every batch: a pass whose worker died frees the
#: deployment's turn after this long.
LEASE_S = 120.0
#: Seconds between a pass that ran out of budget and the follow-up pass it sends.
FOLLOW_UP_DELAY_S = 5.0
#: The tables housekeeping deletes from.
_Purged = (
    type[ScheduleExecution]
    | type[SlotRecord]
    | type[AuditEvent]
    | type[Alert]
    | type[AlertSilence]
    | type[Backfill]
    | type[ScheduleVersion]
)
LEASE_KEY = f"{PREFIX}:housekeeping:lease"
#: A schedule's newest versions, kept whatever their age (docs/versions.md).
KEPT_VERSIONS = 1_000


@dataclass
class PassReport:
    executions: int = 0
    slots: int = 0
    audit_rows: int = 0
    #: Alerts (their deliveries go with them) and silences that ended.
    alerts: int = 0
    silences: int = 0
    #: Backfills (and catch-ups) that ended before the cutoff; their runs go with the executions.
    backfills: int = 0
    #: Metric rows of schedules deleted before versions that retire them with their schedule.
    metric_rows: int = 0
    #: Definition versions past the trail's retention, beyond their schedule's newest KEPT_VERSIONS.
    versions: int = 0
    #: Another pass held the lease: this one did nothing.
    skipped: bool = False
    #: The budget ran out (or the lease was lost) with rows still due.
    unfinished: bool = False
    cutoff: str = ""
    seconds: float = 0.0
    longest_batch_s: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "executions": self.executions,
            "slots": self.slots,
            "audit_rows": self.audit_rows,
            "alerts": self.alerts,
            "silences": self.silences,
            "backfills": self.backfills,
            "metric_rows": self.metric_rows,
            "versions": self.versions,
            "skipped": self.skipped,
            "unfinished": self.unfinished,
            "cutoff": self.cutoff,
            "seconds": round(self.seconds, 3),
            "longest_batch_s": round(self.longest_batch_s, 3),
        }


def purge(
    app: Runtime, *, now: datetime | None = None, budget_s: float | None = None, batch: int | None = None
) -> PassReport:
    """One pass: delete finished executions and slot records older than the retention, in
    batches (``batch`` rows each, or the tables' own sizes), until none are left or ``budget_s``
    is spent (``PASS_BUDGET_S``); nothing if another pass is running."""
    budget_s = PASS_BUDGET_S if budget_s is None else budget_s
    cutoff = (now or utcnow()) - timedelta(days=app.settings.retention_days)
    audit_cutoff = (now or utcnow()) - timedelta(days=app.settings.audit_retention_days)
    report = PassReport(cutoff=cutoff.isoformat())
    lease = get_redis(app.settings.broker_url).lock(LEASE_KEY, timeout=LEASE_S, blocking=False, thread_local=False)
    if not lease.acquire():
        report.skipped = True
        logger.info("housekeeping: another pass is running; this one does nothing")
        return report
    started = time.monotonic()
    try:
        report.metric_rows = retried_transaction(app.settings.database_url, "retiring metrics", retire_orphans)
        _delete_due(
            app.settings.database_url,
            (cutoff, audit_cutoff),
            batch,
            lambda: time.monotonic() - started > budget_s,
            lease,
            report,
        )
    finally:
        report.seconds = time.monotonic() - started
        with contextlib.suppress(LockError):  # expired or taken over: nothing of ours to release
            lease.release()
    if report.executions or report.slots or report.audit_rows or report.alerts or report.silences:
        logger.info(
            "housekeeping removed %s executions and %s slot records older than %s, %s audit rows, %s alerts "
            "and %s silences, in %.1f s%s",
            report.executions,
            report.slots,
            report.cutoff,
            report.audit_rows,
            report.alerts,
            report.silences,
            report.seconds,
            "; more is due, a follow-up pass continues" if report.unfinished else "",
        )
    return report


def _delete_due(
    url: str,
    cutoffs: tuple[datetime, datetime],
    batch: int | None,
    spent: Callable[[], bool],
    lease: Lock,
    report: PassReport,
) -> None:
    cutoff, audit_cutoff = cutoffs
    report.executions, done = _delete_oldest(
        url, ScheduleExecution, _oldest_runs(cutoff), batch or EXECUTION_BATCH, spent, lease, report
    )
    if done:
        report.slots, done = _delete_oldest(
            url, SlotRecord, _oldest_slots(cutoff), batch or SLOT_BATCH, spent, lease, report
        )
    if done:
        oldest_audit = select(AuditEvent.id).where(AuditEvent.at < audit_cutoff).order_by(AuditEvent.at, AuditEvent.id)
        report.audit_rows, done = _delete_oldest(
            url, AuditEvent, oldest_audit, batch or SLOT_BATCH, spent, lease, report
        )
    if done:
        oldest_alerts = select(Alert.id).where(Alert.at < audit_cutoff).order_by(Alert.at, Alert.id)
        report.alerts, done = _delete_oldest(url, Alert, oldest_alerts, batch or EXECUTION_BATCH, spent, lease, report)
    if done:
        ended = select(AlertSilence.id).where(AlertSilence.until < audit_cutoff).order_by(AlertSilence.id)
        report.silences, done = _delete_oldest(url, AlertSilence, ended, batch or SLOT_BATCH, spent, lease, report)
    if done:
        ended_backfills = (
            select(Backfill.id).where(Backfill.finished_at < cutoff).order_by(Backfill.finished_at, Backfill.id)
        )
        report.backfills, done = _delete_oldest(
            url, Backfill, ended_backfills, batch or EXECUTION_BATCH, spent, lease, report
        )
    if done:
        report.versions, done = _delete_oldest(
            url, ScheduleVersion, _old_versions(audit_cutoff), batch or SLOT_BATCH, spent, lease, report
        )
    report.unfinished = not done


def _delete_oldest(
    url: str,
    table: _Purged,
    oldest: Select[Any],
    size: int,
    spent: Callable[[], bool],
    lease: Lock,
    report: PassReport,
) -> tuple[int, bool]:
    """Batches of ``size`` of the rows ``oldest`` selects until none are left (True), or the pass's
    budget is ``spent`` or its lease lost (False); how many rows went."""
    work = partial(_delete_batch, table, oldest, size)
    total = 0
    while True:
        batch_started = time.monotonic()
        deleted = retried_transaction(url, f"purging {table.__tablename__}", work)
        report.longest_batch_s = max(report.longest_batch_s, time.monotonic() - batch_started)
        total += deleted
        if deleted < size:
            return total, True
        if spent():
            return total, False
        try:
            lease.reacquire()  # the deployment's turn is still this pass's, for another LEASE_S
        except LockError:
            logger.warning("housekeeping: the pass lost its lease (stalled for over %.0f s); stopping", LEASE_S)
            return total, False


def _oldest_runs(cutoff: datetime) -> Select[Any]:
    return (
        select(ScheduleExecution.id)
        .where(ScheduleExecution.completed_at < cutoff, ScheduleExecution.status != ExecutionStatus.IN_PROGRESS)
        .order_by(ScheduleExecution.completed_at, ScheduleExecution.id)
    )


def _old_versions(cutoff: datetime) -> Select[Any]:
    """Versions older than ``cutoff`` that no kept run ran, and either of a deleted schedule or not
    among their schedule's newest :data:`KEPT_VERSIONS`. Each kind is found through the
    ``(schedule_id, version)`` index (a deleted schedule's under a null ``schedule_id``; of the
    live schedules only those with more versions than that are looked at), never by reading every
    version; the runs through ``(schedule_name, version, id)``."""
    ran = exists().where(
        ScheduleExecution.schedule_name == ScheduleVersion.schedule_name,
        ScheduleExecution.version == ScheduleVersion.version,
    )
    gone = select(ScheduleVersion.id).where(ScheduleVersion.schedule_id.is_(None), ScheduleVersion.at < cutoff)
    beyond_kept = (
        select(ScheduleVersion.id)
        .join(Schedule, Schedule.id == ScheduleVersion.schedule_id)
        .where(
            Schedule.version > KEPT_VERSIONS,
            ScheduleVersion.version <= Schedule.version - KEPT_VERSIONS,
            ScheduleVersion.at < cutoff,
        )
    )
    return (
        select(ScheduleVersion.id)
        .where(ScheduleVersion.id.in_(union_all(gone, beyond_kept)), ~ran)
        .order_by(ScheduleVersion.id)
    )


def _oldest_slots(cutoff: datetime) -> Select[Any]:
    return select(SlotRecord.id).where(SlotRecord.recorded_at < cutoff).order_by(SlotRecord.recorded_at, SlotRecord.id)


def _delete_batch(table: _Purged, oldest: Select[Any], batch: int, session: Session) -> int:
    """Delete up to ``batch`` of the rows ``oldest`` selects, locked in that order; how many."""
    # Only the rows to delete are locked (not a joined schedule's, which PostgreSQL also refuses on
    # the nullable side of an outer join).
    ids = list(session.scalars(oldest.limit(batch).with_for_update(of=table)))
    return affected(session, delete(table).where(table.id.in_(ids))) if ids else 0
