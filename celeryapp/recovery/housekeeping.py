"""Housekeeping: finished executions (with their activities) and slot records past retention go."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy import delete, select

from models import ExecutionStatus, ScheduleExecution, SlotRecord, transaction, utcnow
from models.session import affected

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
    while True:
        with transaction(url) as session:
            ids = list(
                session.scalars(
                    select(ScheduleExecution.id)
                    .where(
                        ScheduleExecution.status != ExecutionStatus.IN_PROGRESS, ScheduleExecution.completed_at < cutoff
                    )
                    .limit(batch)
                )
            )
            if not ids:
                break
            # Activities go with their execution (ON DELETE CASCADE).
            removed["executions"] += affected(session, delete(ScheduleExecution).where(ScheduleExecution.id.in_(ids)))
    while True:
        with transaction(url) as session:
            ids = list(session.scalars(select(SlotRecord.id).where(SlotRecord.recorded_at < cutoff).limit(batch)))
            if not ids:
                break
            removed["slots"] += affected(session, delete(SlotRecord).where(SlotRecord.id.in_(ids)))
    if any(removed.values()):
        logger.info(
            "housekeeping removed %s executions and %s slot records older than %s",
            removed["executions"],
            removed["slots"],
            cutoff.isoformat(),
        )
    return removed
