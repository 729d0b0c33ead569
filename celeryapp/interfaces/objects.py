"""The JSON objects of the contract: schedule objects and execution objects."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from celeryapp.domain.redaction import hide_env_values
from celeryapp.domain.times import iso
from celeryapp.interfaces.alerts import open_counts, silences_of
from models import Activity, AlertSilence, Schedule, ScheduleExecution, WorkerTask
from models.definitions import definition_of


@dataclass(frozen=True)
class Alerting:
    """What a schedule object says of its alerts: the silence in force and how many are open."""

    silence: AlertSilence | None = None
    open: int = 0


def alerting_of(session: Session, names: Iterable[str], now: datetime) -> dict[str, Alerting]:
    """Each schedule's :class:`Alerting`, in two queries whatever the number of schedules."""
    wanted = set(names)
    counts, silences = open_counts(session, wanted), silences_of(session, wanted, now)
    return {name: Alerting(silences.get(name), counts.get(name, 0)) for name in wanted}


def one_schedule_json(session: Session, schedule: Schedule, now: datetime) -> dict[str, Any]:
    return schedule_json(schedule, alerting_of(session, [schedule.name], now)[schedule.name])


def schedule_json(schedule: Schedule, alerting: Alerting) -> dict[str, Any]:
    out = definition_of(schedule).to_json()
    # Executables' env values may be credentials: they stay on the workers, only names are shown.
    out["steps"] = hide_env_values(out["steps"])
    out.update(
        status=schedule.status.value,
        run_count=schedule.run_count,
        error_count=schedule.error_count,
        current_retry=schedule.current_retry,
        last_error=schedule.last_error,
        last_run_at=iso(schedule.last_run_at),
        next_run_at=iso(schedule.retry_at or schedule.next_run_at),
        paused_by=schedule.paused_by,
        paused_reason=schedule.paused_reason,
        paused_at=iso(schedule.paused_at),
        silenced=_silenced(alerting.silence),
        open_alerts=alerting.open,
    )
    return out


def _silenced(silence: AlertSilence | None) -> dict[str, Any] | None:
    if silence is None:
        return None
    return {"until": iso(silence.until), "by": silence.actor, "reason": silence.reason}


def execution_json(session: Session, execution: ScheduleExecution) -> dict[str, Any]:
    activities = session.scalars(
        select(Activity).where(Activity.execution_id == execution.id).order_by(Activity.step_index, Activity.id)
    ).all()
    tasks = session.scalars(
        select(WorkerTask).where(WorkerTask.execution_id == execution.id).order_by(WorkerTask.step_index, WorkerTask.id)
    ).all()
    return {
        "id": execution.id,
        "schedule": execution.schedule_name,
        "status": execution.status.value,
        "trigger": execution.trigger.value,
        "run_key": execution.run_key,
        "current_step_index": execution.current_step_index,
        "started_at": iso(execution.started_at),
        "completed_at": iso(execution.completed_at),
        "error": execution.error,
        "rerun_of": execution.rerun_of,
        "rerun_from_group": execution.rerun_from_group,
        "slot": iso(execution.slot),
        "payload": execution.payload,
        "activities": [
            {
                "step_index": a.step_index,
                "step": a.step_name,
                "status": a.status.value,
                "attempt": a.attempt,
                "started_at": iso(a.started_at),
                "completed_at": iso(a.completed_at),
                "error": a.error,
                "message": a.message,
                "worker": a.worker,
                "traceback": a.traceback,
                "log_tail": a.log_tail,
            }
            for a in activities
        ],
        "tasks": [
            {"step_index": t.step_index, "step": t.step_name, "status": t.status.value, "attempt": t.attempt}
            for t in tasks
        ],
    }
