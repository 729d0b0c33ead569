"""Housekeeping: finished executions (with their activities) and slot records past retention go."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from models import ExecutionStatus, ScheduleExecution, SlotRecord, utcnow
from models.session import affected, retried_transaction

if TYPE_CHECKING:
    from celeryapp.app import ChordbeatCelery

logger = logging.getLogger(__name__)

#: Rows deleted per transaction, so a large backlog never holds long locks.
BATCH = 500


def purge(app: ChordbeatCelery, *, now: datetime | None = None, batch: int = BATCH) -> dict[str, int]:
    """Delete finished executions and slot records older than the retention, in batches."""
    cutoff = (now or utcnow()) - timedelta(days=app.settings.retention_days)
    removed = {"executions": 0, "slots": 0}
    url = app.settings.database_url
    finished = (ScheduleExecution.status != ExecutionStatus.IN_PROGRESS, ScheduleExecution.completed_at < cutoff)
    # Activities go with their execution (ON DELETE CASCADE).
    old_slots = (SlotRecord.recorded_at < cutoff,)
    while deleted := retried_transaction(url, "purging runs", partial(_delete, ScheduleExecution, finished, batch)):
        removed["executions"] += deleted
    while deleted := retried_transaction(url, "purging slot records", partial(_delete, SlotRecord, old_slots, batch)):
        removed["slots"] += deleted
    if any(removed.values()):
        logger.info(
            "housekeeping removed %s executions and %s slot records older than %s",
            removed["executions"],
            removed["slots"],
            cutoff.isoformat(),
        )
    return removed


def _delete(
    table: type[ScheduleExecution] | type[SlotRecord], where: tuple[Any, ...], batch: int, session: Session
) -> int:
    """Delete up to ``batch`` rows of ``table``, locked in id order (two passes at once wait for
    each other instead of deadlocking); how many."""
    ids = list(session.scalars(select(table.id).where(*where).order_by(table.id).limit(batch).with_for_update()))
    return affected(session, delete(table).where(table.id.in_(ids))) if ids else 0
