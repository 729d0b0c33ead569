"""The operations behind the public service tasks; JSON in, JSON out.

Each opens one transaction, and sends what it decided (chords, cancels) only after commit.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select, update

from celeryapp.app import ChordbeatCelery
from celeryapp.beat_entries import cadence_of
from celeryapp.definition import parse_definition
from celeryapp.dispatch import apply_effects
from celeryapp.errors import InvalidTransition, NotFound
from celeryapp.lifecycle import Effects, start_execution
from celeryapp.lifecycle import cancel_execution as cancel_in_db
from celeryapp.step_policy import StepRules
from celeryapp.store import find_schedule, upsert_schedule
from celeryapp.views import execution_json, iso, schedule_json
from models import (
    ExecutionStatus,
    Schedule,
    ScheduleExecution,
    ScheduleSource,
    ScheduleStatus,
    SlotRecord,
    Trigger,
    transaction,
    utcnow,
)
from models.session import affected

#: Most executions one ``list_executions`` call returns.
MAX_LIST_LIMIT = 1000


def known_task(app: ChordbeatCelery) -> StepRules:
    """What steps may do, as this process (the worker, for service calls) sees it: tasks that are
    registered here and allowed as steps, enabled kinds, allowed programs and SQL variables."""
    return StepRules(app.settings, registered=app.tasks.__contains__)


def apply_schedule(
    app: ChordbeatCelery, definition: Any, *, source: ScheduleSource = ScheduleSource.API
) -> dict[str, Any]:
    parsed = parse_definition(definition, known_task=known_task(app))
    with transaction(app.settings.database_url) as session:
        schedule, _change = upsert_schedule(session, parsed, source=source, now=utcnow())
        result = schedule_json(schedule)
    _sync(app, parsed.name)
    return result


def _sync(app: ChordbeatCelery, name: str) -> None:
    apply_effects(app, Effects(resync=[name]))


def delete_schedule(app: ChordbeatCelery, name: str) -> dict[str, Any]:
    with transaction(app.settings.database_url) as session:
        schedule = find_schedule(session, name)
        session.delete(schedule)
    _sync(app, name)
    return {"name": name, "deleted": True}


def get_schedule(app: ChordbeatCelery, name: str) -> dict[str, Any]:
    with transaction(app.settings.database_url, read_only=True) as session:
        return schedule_json(find_schedule(session, name))


def list_schedules(app: ChordbeatCelery) -> list[dict[str, Any]]:
    with transaction(app.settings.database_url, read_only=True) as session:
        return [schedule_json(s) for s in session.scalars(select(Schedule).order_by(Schedule.name))]


def pause_schedule(app: ChordbeatCelery, name: str) -> dict[str, Any]:
    with transaction(app.settings.database_url) as session:
        schedule = find_schedule(session, name)
        if schedule.status is not ScheduleStatus.PAUSED:
            paused = affected(
                session,
                update(Schedule)
                .where(Schedule.id == schedule.id, Schedule.status == ScheduleStatus.ACTIVE)
                .values(status=ScheduleStatus.PAUSED, next_run_at=None, retry_at=None, buffered=False),
            )
            if not paused:
                raise InvalidTransition(
                    f"schedule {name!r} is {schedule.status.value}; only an active schedule can be paused"
                )
            session.refresh(schedule)
        result = schedule_json(schedule)
    _sync(app, name)
    return result


def resume_schedule(app: ChordbeatCelery, name: str) -> dict[str, Any]:
    with transaction(app.settings.database_url) as session:
        schedule = find_schedule(session, name)
        if schedule.status is not ScheduleStatus.ACTIVE:
            now = utcnow()
            resumed = affected(
                session,
                update(Schedule)
                .where(Schedule.id == schedule.id, Schedule.status == ScheduleStatus.PAUSED)
                .values(status=ScheduleStatus.ACTIVE, next_run_at=cadence_of(schedule).slot_after(now)),
            )
            if not resumed:
                raise InvalidTransition(
                    f"schedule {name!r} is {schedule.status.value}; only a paused schedule can be resumed"
                )
            session.refresh(schedule)
        result = schedule_json(schedule)
    _sync(app, name)
    return result


def trigger_schedule(app: ChordbeatCelery, name: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
    if payload is not None and not isinstance(payload, dict):
        raise ValueError("payload: must be an object")
    with transaction(app.settings.database_url) as session:
        schedule = find_schedule(session, name)
        result = start_execution(
            session,
            schedule,
            trigger=Trigger.MANUAL,
            now=utcnow(),
            payload=payload,
            run_key=f"{name}:manual:{uuid.uuid4().hex}",
        )
    apply_effects(app, result.effects)
    if result.execution_id is None or result.skipped:
        return {"execution_id": None, "skipped": result.skipped}
    return {"execution_id": result.execution_id, "status": ExecutionStatus.IN_PROGRESS.value}


def cancel_execution(app: ChordbeatCelery, execution_id: int) -> dict[str, Any]:
    with transaction(app.settings.database_url) as session:
        effects = cancel_in_db(session, int(execution_id), now=utcnow())
    apply_effects(app, effects)
    return get_execution(app, execution_id)


def get_execution(app: ChordbeatCelery, execution_id: int) -> dict[str, Any]:
    with transaction(app.settings.database_url, read_only=True) as session:
        execution = session.get(ScheduleExecution, int(execution_id))
        if execution is None:
            raise NotFound(f"execution {execution_id} does not exist")
        return execution_json(session, execution)


def list_executions(
    app: ChordbeatCelery, schedule: str | None = None, status: str | None = None, limit: int = 50
) -> list[dict[str, Any]]:
    if status is not None:
        try:
            status = ExecutionStatus(status).value
        except ValueError:
            raise ValueError(f"status: must be one of {', '.join(s.value for s in ExecutionStatus)}") from None
    _check_limit(limit)
    query = select(ScheduleExecution).order_by(ScheduleExecution.id.desc()).limit(limit)
    if schedule is not None:
        query = query.where(ScheduleExecution.schedule_name == schedule)
    if status is not None:
        query = query.where(ScheduleExecution.status == ExecutionStatus(status))
    with transaction(app.settings.database_url, read_only=True) as session:
        return [execution_json(session, e) for e in session.scalars(query).all()]


def list_slots(app: ChordbeatCelery, name: str, limit: int = 50) -> list[dict[str, Any]]:
    """What became of the schedule's recent due times, newest first: why a run did or did not happen."""
    _check_limit(limit)
    with transaction(app.settings.database_url, read_only=True) as session:
        rows = session.scalars(
            select(SlotRecord).where(SlotRecord.schedule_name == name).order_by(SlotRecord.id.desc()).limit(limit)
        ).all()
        if not rows:
            find_schedule(session, name)
        return [
            {
                "schedule": r.schedule_name,
                "nominal_at": iso(r.nominal_at),
                "trigger": r.trigger.value,
                "outcome": r.outcome.value,
                "execution_id": r.execution_id,
                "detail": r.detail,
                "recorded_at": iso(r.recorded_at),
            }
            for r in rows
        ]


def _check_limit(limit: Any) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIST_LIMIT:
        raise ValueError(f"limit: must be an integer between 1 and {MAX_LIST_LIMIT}")


__all__ = [
    "apply_schedule",
    "cancel_execution",
    "delete_schedule",
    "get_execution",
    "get_schedule",
    "list_executions",
    "list_schedules",
    "list_slots",
    "pause_schedule",
    "resume_schedule",
    "trigger_schedule",
]
