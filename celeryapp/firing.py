"""What a beat entry's fire message does: start the run of one nominal slot, or record why not."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from sqlalchemy import select, update

from celeryapp.app import ChordbeatCelery
from celeryapp.beat_entries import cadence_of
from celeryapp.dispatch import apply_effects
from celeryapp.lifecycle import Effects, record_slot, start_execution
from celeryapp.views import iso
from models import Schedule, ScheduleStatus, SlotOutcome, Trigger, transaction, utcnow

logger = logging.getLogger(__name__)


def run_key(name: str, trigger: Trigger, nominal_at: datetime, retry: int = 0) -> str:
    """The same slot (and retry) always gives the same key: two beats or a redelivery make one run."""
    kind = f"retry{retry}" if trigger is Trigger.RETRY else trigger.value
    return f"{name}:{kind}:{iso(nominal_at)}"


def fire(app: ChordbeatCelery, name: str, *, nominal_at: datetime, trigger: Trigger) -> dict[str, Any]:
    now = utcnow()
    effects = Effects()
    with transaction(app.settings.database_url) as session:
        # The row lock orders this fire after any run of the schedule that is ending right now.
        schedule = session.scalar(select(Schedule).where(Schedule.name == name).with_for_update())
        if schedule is None:
            logger.info("fire of %r ignored: the schedule no longer exists", name)
            return {"execution_id": None, "skipped": "schedule does not exist"}
        if schedule.status is not ScheduleStatus.ACTIVE:
            # Pause is non-destructive: a fire message already on its way does nothing.
            if schedule.status is ScheduleStatus.PAUSED:
                record_slot(
                    session,
                    schedule,
                    SlotOutcome.SKIPPED_PAUSED,
                    trigger=trigger,
                    nominal_at=nominal_at,
                    now=now,
                    detail="schedule is paused",
                )
            return {"execution_id": None, "skipped": f"schedule is {schedule.status.value}"}
        if trigger is Trigger.RETRY and schedule.retry_at is None:
            # A run succeeded since the retry was planned (a manual one, say): nothing to retry.
            return {"execution_id": None, "skipped": "no retry is pending"}
        if trigger is not Trigger.RETRY and schedule.retry_at is not None:
            record_slot(
                session,
                schedule,
                SlotOutcome.RETRY,
                trigger=trigger,
                nominal_at=nominal_at,
                now=now,
                detail=f"retry {schedule.current_retry} is pending; it replaces this run",
            )
            return {"execution_id": None, "skipped": "a retry replaces this run"}
        result = start_execution(
            session,
            schedule,
            trigger=trigger,
            now=now,
            nominal_at=nominal_at,
            run_key=run_key(name, trigger, nominal_at, schedule.current_retry),
        )
        effects.merge(result.effects)
        session.execute(
            update(Schedule)
            .where(Schedule.id == schedule.id)
            .values(next_run_at=cadence_of(schedule).slot_after(max(now, nominal_at)))
        )
    apply_effects(app, effects)
    if result.skipped:
        return {"execution_id": None, "skipped": result.skipped}
    return {"execution_id": result.execution_id, "status": "in_progress"}
