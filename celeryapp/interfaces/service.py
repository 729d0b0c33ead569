"""The operations behind the public service tasks; JSON in, JSON out.

Each checks every argument before it opens its one transaction (anyone who can publish to the
broker can call these: a wrong argument raises :class:`InvalidArgument` naming it, and nothing is
written), and sends what it decided (chords, cancels) only after commit. A transaction that writes
is run again when the database aborts it to break a deadlock (:func:`models.session.retrying`).
"""

from __future__ import annotations

import uuid
from functools import partial
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from celeryapp.domain.effects import Effects
from celeryapp.domain.limits import (
    MAX_EXECUTION_LIST_LIMIT,
    MAX_ID,
    MAX_LIST_LIMIT,
    MAX_NAME_CHARS,
    MAX_SCHEDULE_LIST_LIMIT,
    check_json,
    is_unicode,
    short_repr,
    type_name,
)
from celeryapp.domain.step_policy import StepRules
from celeryapp.domain.times import iso
from celeryapp.domain.transitions import decide_pause, decide_resume
from celeryapp.domain.validation import parse_definition
from celeryapp.errors import InvalidArgument, NotFound
from celeryapp.execution.runs import StartResult, start_execution
from celeryapp.execution.runs import cancel_execution as cancel_in_db
from celeryapp.interfaces.summaries import execution_summaries, schedules_page
from celeryapp.interfaces.views import execution_json, schedule_json
from celeryapp.monitoring import metric_counts
from celeryapp.scheduling.store import change_status, find_schedule, upsert_schedule
from celeryapp.worker.dispatch import apply_effects
from models import (
    ExecutionStatus,
    Schedule,
    ScheduleExecution,
    ScheduleSource,
    SlotRecord,
    Trigger,
    transaction,
    utcnow,
)
from models.session import retried_transaction

if TYPE_CHECKING:
    from celeryapp.application import ChordbeatCelery


def step_rules(app: ChordbeatCelery) -> StepRules:
    """What steps may do, as this process (the worker, for service calls) sees it: tasks that are
    registered here and allowed as steps, enabled kinds, allowed programs and SQL variables."""
    return StepRules.of(app.settings, registered=app.tasks.__contains__)


def apply_schedule(
    app: ChordbeatCelery, definition: Any, *, source: ScheduleSource = ScheduleSource.API
) -> dict[str, Any]:
    parsed = parse_definition(definition, rules=step_rules(app))

    def store(session: Session) -> dict[str, Any]:
        return schedule_json(upsert_schedule(session, parsed, source=source, now=utcnow())[0])

    result = retried_transaction(app.settings.database_url, f"applying schedule {parsed.name!r}", store)
    _sync(app, parsed.name)
    return result


def _sync(app: ChordbeatCelery, name: str) -> None:
    apply_effects(app, Effects(resync=[name]))


def delete_schedule(app: ChordbeatCelery, name: str) -> dict[str, Any]:
    name = _name(name)

    def remove(session: Session) -> None:
        # Locked first, as everything that changes a schedule and its runs does (the lock order).
        session.delete(find_schedule(session, name, lock=True))
        metric_counts.retire_schedule(session, name)

    retried_transaction(app.settings.database_url, f"deleting schedule {name!r}", remove)
    _sync(app, name)
    return {"name": name, "deleted": True}


def get_schedule(app: ChordbeatCelery, name: str) -> dict[str, Any]:
    name = _name(name)
    with transaction(app.settings.database_url, read_only=True) as session:
        return schedule_json(find_schedule(session, name))


def list_schedules(app: ChordbeatCelery, limit: int = 500, after_name: str | None = None) -> list[dict[str, Any]]:
    """By name; ``after_name``: only the schedules after it (the cursor: the last name of a page).
    A page stops short of ``limit`` where its JSON would pass ``MAX_SCHEDULE_PAGE_BYTES``; rows are
    read a hundred at a time, so the schedules past that point are never loaded."""
    limit = _limit(limit, MAX_SCHEDULE_LIST_LIMIT)
    query = select(Schedule).order_by(Schedule.name).limit(limit).execution_options(yield_per=100)
    if after_name is not None:
        query = query.where(Schedule.name > _name(after_name, "after_name"))
    with transaction(app.settings.database_url, read_only=True) as session:
        rows = session.scalars(query)
        try:
            return schedules_page(schedule_json(s) for s in rows)
        finally:
            rows.close()  # PostgreSQL streams them through a server-side cursor


def pause_schedule(app: ChordbeatCelery, name: str) -> dict[str, Any]:
    name = _name(name)
    result = retried_transaction(app.settings.database_url, f"pausing schedule {name!r}", partial(_pause, name=name))
    _sync(app, name)
    return result


def _pause(session: Session, *, name: str) -> dict[str, Any]:
    return schedule_json(change_status(session, name, decide_pause, now=utcnow()))


def resume_schedule(app: ChordbeatCelery, name: str) -> dict[str, Any]:
    name = _name(name)
    result = retried_transaction(app.settings.database_url, f"resuming schedule {name!r}", partial(_resume, name=name))
    _sync(app, name)
    return result


def _resume(session: Session, *, name: str) -> dict[str, Any]:
    return schedule_json(change_status(session, name, decide_resume, now=utcnow()))


def trigger_schedule(app: ChordbeatCelery, name: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
    name = _name(name)
    payload = _payload(payload)
    run_key = f"{name}:manual:{uuid.uuid4().hex}"

    def start(session: Session) -> StartResult:
        schedule = find_schedule(session, name, lock=True)
        return start_execution(
            session, schedule, trigger=Trigger.MANUAL, now=utcnow(), payload=payload, run_key=run_key, locked=True
        )

    result = retried_transaction(app.settings.database_url, f"starting a run of {name!r}", start)
    apply_effects(app, result.effects)
    if result.execution_id is None or result.skipped:
        return {"execution_id": None, "skipped": result.skipped}
    return {"execution_id": result.execution_id, "status": ExecutionStatus.IN_PROGRESS.value}


def cancel_execution(app: ChordbeatCelery, execution_id: int) -> dict[str, Any]:
    execution_id = _execution_id(execution_id)
    effects = retried_transaction(
        app.settings.database_url,
        f"cancelling execution {execution_id}",
        lambda session: cancel_in_db(session, execution_id, now=utcnow()),
    )
    apply_effects(app, effects)
    return get_execution(app, execution_id)


def get_execution(app: ChordbeatCelery, execution_id: int) -> dict[str, Any]:
    execution_id = _execution_id(execution_id)
    with transaction(app.settings.database_url, read_only=True) as session:
        execution = session.get(ScheduleExecution, execution_id)
        if execution is None:
            raise NotFound(f"execution {execution_id} does not exist")
        return execution_json(session, execution)


def list_executions(
    app: ChordbeatCelery,
    schedule: str | None = None,
    status: str | None = None,
    limit: int = 50,
    before_id: int | None = None,
) -> list[dict[str, Any]]:
    """Summaries, newest first; ``before_id``: only older runs (the cursor: the last id of a page).
    An answer is at most ``limit`` times ``summaries.MAX_SUMMARY_BYTES``."""
    schedule = None if schedule is None else _name(schedule, "schedule")
    wanted = _status(status)
    limit = _limit(limit, MAX_EXECUTION_LIST_LIMIT)
    before = None if before_id is None else _execution_id(before_id, "before_id")
    with transaction(app.settings.database_url, read_only=True) as session:
        return execution_summaries(session, schedule=schedule, status=wanted, limit=limit, before_id=before)


def list_slots(app: ChordbeatCelery, name: str, limit: int = 50) -> list[dict[str, Any]]:
    """What became of the schedule's recent due times, newest first: why a run did or did not happen."""
    name = _name(name)
    limit = _limit(limit)
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


# --- arguments -----------------------------------------------------------------------------------


def _name(value: Any, field: str = "name") -> str:
    """A schedule to look up. Not held to the name pattern, so a schedule stored before a rule
    tightened can still be found, paused and deleted."""
    if not isinstance(value, str):
        raise InvalidArgument(field, f"must be a schedule name (a string), got {type_name(value)}")
    if not 1 <= len(value) <= MAX_NAME_CHARS:
        raise InvalidArgument(field, f"must be 1 to {MAX_NAME_CHARS} characters, got {len(value)}")
    # No stored name holds these, and the database drivers refuse them with a traceback.
    if "\x00" in value or not is_unicode(value):
        raise InvalidArgument(field, "must not hold NUL characters or lone surrogates")
    return value


def _execution_id(value: Any, field: str = "execution_id") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(field, f"must be an integer (an execution id), got {type_name(value)}")
    if not 1 <= value <= MAX_ID:
        raise InvalidArgument(field, f"must be between 1 and {MAX_ID}, got {short_repr(value)}")
    return value


def _limit(value: Any, high: int = MAX_LIST_LIMIT) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        got = short_repr(value) if isinstance(value, int) and not isinstance(value, bool) else type_name(value)
        raise InvalidArgument("limit", f"must be an integer between 1 and {high}, got {got}")
    return value


def _status(value: Any) -> ExecutionStatus | None:
    if value is None:
        return None
    choices = ", ".join(s.value for s in ExecutionStatus)
    if not isinstance(value, str):
        raise InvalidArgument("status", f"must be one of {choices}, got {type_name(value)}")
    try:
        return ExecutionStatus(value)
    except ValueError:
        raise InvalidArgument("status", f"must be one of {choices}, got {short_repr(value)}") from None


def _payload(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidArgument("payload", f"must be an object, got {type_name(value)}")
    check_json(value, "payload", InvalidArgument)
    return value


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
