"""A run that meets an active run of its exclusive schedule: which runs are active, and the
overlap decision applied (buffered or skipped, recorded)."""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy import exists, select, update
from sqlalchemy.orm import Session

from celeryapp.domain.decisions import OverlapAction, OverlapDecision
from celeryapp.domain.effects import Effects
from celeryapp.execution.run_rows import StartResult
from celeryapp.execution.slot_records import record_slot
from models import ExecutionStatus, Schedule, ScheduleExecution, Trigger
from models.session import affected

logger = logging.getLogger(__name__)


def active_executions(session: Session, schedule_id: int) -> list[tuple[int, int | None]]:
    """The schedule's runs in progress, oldest first, each with its backfill (None: not a backfill's)."""
    return [
        (execution_id, backfill_id)
        for execution_id, backfill_id in session.execute(
            select(ScheduleExecution.id, ScheduleExecution.backfill_id)
            .where(
                ScheduleExecution.schedule_id == schedule_id,
                ScheduleExecution.status == ExecutionStatus.IN_PROGRESS,
            )
            .order_by(ScheduleExecution.id)
        )
    ]


def apply_overlap(
    session: Session,
    schedule: Schedule,
    overlap: OverlapDecision,
    *,
    trigger: Trigger,
    nominal_at: datetime | None,
    now: datetime,
) -> StartResult | None:
    """Apply a run's overlap decision: record why it does not start; ``None`` if it was to be
    buffered but the active run ended meanwhile: start it."""
    if overlap.action is OverlapAction.BUFFER:
        still_running = exists().where(
            ScheduleExecution.schedule_id == schedule.id, ScheduleExecution.status == ExecutionStatus.IN_PROGRESS
        )
        if not affected(
            session, update(Schedule).where(Schedule.id == schedule.id, still_running).values(buffered=True)
        ):
            return None
    if overlap.outcome is not None:
        record_slot(
            session, schedule, overlap.outcome, trigger=trigger, nominal_at=nominal_at, now=now, detail=overlap.detail
        )
    # Skips are counted for the deployment's overload warning (one a minute), not logged one by one.
    logger.info("schedule %r: %s", schedule.name, overlap.detail)
    skipped = 1 if overlap.action is OverlapAction.SKIP else 0
    return StartResult(None, skipped=overlap.skipped, effects=Effects(skipped_overlap=skipped))
