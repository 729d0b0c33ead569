"""The operations behind the public service tasks; JSON in, JSON out.

Each checks every argument before it opens its one transaction (anyone who can publish to the
broker can call these: a wrong argument raises :class:`InvalidArgument` naming it, and nothing is
written), and sends what it decided (chords, cancels) only after commit. A transaction that writes
is run again when the database aborts it to break a deadlock (:func:`models.session.retrying`).
The backfills', alerts' and next fires' operations are in their own modules (backfill_service.py,
alerts.py, next_fires.py, wiring_checks.py); tasks/service.py calls each where it is defined.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from sqlalchemy import Row, select
from sqlalchemy.orm import Session

from celeryapp.domain.effects import Effects
from celeryapp.domain.limits import MAX_EXECUTION_LIST_LIMIT, MAX_SCHEDULE_LIST_LIMIT
from celeryapp.domain.pause_resume import decide_pause, decide_resume
from celeryapp.domain.step_policy import StepRules
from celeryapp.domain.times import iso
from celeryapp.domain.validation import parse_definition
from celeryapp.errors import InvalidArgument, NotFound
from celeryapp.execution.backfills import cancel_backfills_of, drive_backfills
from celeryapp.execution.reruns import start_rerun
from celeryapp.execution.run_rows import StartResult
from celeryapp.execution.runs import cancel_execution as cancel_in_db
from celeryapp.execution.runs import start_execution
from celeryapp.interfaces.arguments import actor_arg as _actor
from celeryapp.interfaces.arguments import execution_id_arg as _execution_id
from celeryapp.interfaces.arguments import flag_arg as _flag
from celeryapp.interfaces.arguments import limit_arg as _limit
from celeryapp.interfaces.arguments import name_arg as _name
from celeryapp.interfaces.arguments import payload_arg as _payload
from celeryapp.interfaces.arguments import reason_arg as _reason
from celeryapp.interfaces.arguments import status_arg as _status
from celeryapp.interfaces.arguments import version_arg
from celeryapp.interfaces.audit import MAX_AUDIT_LIMIT, audit_filter, audit_rows
from celeryapp.interfaces.objects import alerting_of, execution_json, one_schedule_json, schedule_json
from celeryapp.interfaces.summaries import execution_summaries, schedules_page
from celeryapp.monitoring import metric_counts, worker_registry
from celeryapp.recovery.paused_slots import record_paused_slots
from celeryapp.scheduling.calendar_files import calendar_reader
from celeryapp.scheduling.store import change_status, find_schedule, upsert_schedule
from celeryapp.states import AuditAction, AuditSource
from celeryapp.worker.dispatch import apply_effects
from models import (
    ExecutionStatus,
    ScheduleExecution,
    ScheduleSource,
    SlotRecord,
    Trigger,
    transaction,
    utcnow,
)
from models.audit import Note
from models.session import retried_transaction
from models.tables import SCHEDULE_STEPS, SCHEDULES
from models.versions import VersionOrigin

if TYPE_CHECKING:
    from celeryapp.application import ChordbeatCelery


def step_rules(app: ChordbeatCelery) -> StepRules:
    """What steps may do: tasks registered and allowed as steps, enabled kinds, allowed programs
    and SQL variables, as the live workers consuming each step's queue published them
    (monitoring/worker_registry.py); as this process sees it when no worker published."""
    return worker_registry.step_rules(app.settings, app.tasks.__contains__)


def apply_schedule(
    app: ChordbeatCelery,
    definition: Any,
    actor: str | None = None,
    reason: str | None = None,
    *,
    source: AuditSource = AuditSource.SERVICE,
    schedule_source: ScheduleSource = ScheduleSource.API,
) -> dict[str, Any]:
    who, why = _actor(actor, source), _reason(reason)
    parsed = parse_definition(
        definition,
        rules=step_rules(app),
        channels=app.alert_channels,
        calendars=calendar_reader(app.settings.calendars_dir),
    )

    def store(session: Session) -> dict[str, Any]:
        origin = VersionOrigin.of(who, why)
        schedule, change = upsert_schedule(
            session, parsed, source=schedule_source, now=utcnow(), origin=origin, paused_by=who.name
        )
        who.record(session, AuditAction.APPLY, parsed.name, reason=why, detail={"change": change.value})
        return one_schedule_json(session, schedule, utcnow())

    result = retried_transaction(app.settings.database_url, f"applying schedule {parsed.name!r}", store)
    _sync(app, parsed.name)
    return result


def _sync(app: ChordbeatCelery, name: str) -> None:
    apply_effects(app, Effects(resync=[name]))


def delete_schedule(
    app: ChordbeatCelery,
    name: str,
    actor: str | None = None,
    reason: str | None = None,
    *,
    source: AuditSource = AuditSource.SERVICE,
) -> dict[str, Any]:
    name, who, why = _name(name), _actor(actor, source), _reason(reason)

    def remove(session: Session) -> None:
        # Locked first, as everything that changes a schedule and its runs does (the lock order).
        schedule = find_schedule(session, name, lock=True)
        # Its slots not started never will: the backfill ends with the schedule.
        cancel_backfills_of(session, schedule.id, now=utcnow())
        session.delete(schedule)
        metric_counts.retire_schedule(session, name)
        who.record(session, AuditAction.DELETE, name, reason=why)

    retried_transaction(app.settings.database_url, f"deleting schedule {name!r}", remove)
    _sync(app, name)
    return {"name": name, "deleted": True}


def get_schedule(app: ChordbeatCelery, name: str) -> dict[str, Any]:
    name = _name(name)
    with transaction(app.settings.database_url, read_only=True) as session:
        return one_schedule_json(session, find_schedule(session, name), utcnow(), runs=True)


def list_schedules(app: ChordbeatCelery, limit: int = 500, after_name: str | None = None) -> list[dict[str, Any]]:
    """By name; ``after_name``: only the schedules after it (the cursor: the last name of a page).
    A page stops short of ``limit`` where its JSON would pass ``MAX_SCHEDULE_PAGE_BYTES``; rows are
    read a hundred at a time, so the schedules past that point are never loaded. Read as rows, not
    ORM objects: the objects (a schedule's and its steps', tied to each other) were most of a
    page's time, building them and collecting them after (docs/scaling.md)."""
    limit = _limit(limit, MAX_SCHEDULE_LIST_LIMIT)
    query = select(SCHEDULES).order_by(SCHEDULES.c.name).limit(limit).execution_options(yield_per=100)
    if after_name is not None:
        query = query.where(SCHEDULES.c.name > _name(after_name, "after_name"))
    with transaction(app.settings.database_url, read_only=True) as session:
        rows = session.execute(query)

        def objects() -> Iterator[dict[str, Any]]:
            now = utcnow()
            # A page is cut where its JSON grows too big: steps and alerting are read for a hundred
            # rows at a time.
            for part in rows.partitions(100):
                steps: dict[int, list[Row[Any]]] = {}
                wanted = select(SCHEDULE_STEPS).where(SCHEDULE_STEPS.c.schedule_id.in_([s.id for s in part]))
                for step in session.execute(wanted):
                    steps.setdefault(step.schedule_id, []).append(step)
                alerting = alerting_of(session, [s.name for s in part], now)
                # Rows have every column of the table as an attribute (what the fields name).
                yield from (schedule_json(s, steps.get(s.id, ()), alerting[s.name]) for s in part)

        try:
            return schedules_page(objects())
        finally:
            rows.close()  # PostgreSQL streams them through a server-side cursor


def pause_schedule(
    app: ChordbeatCelery,
    name: str,
    actor: str | None = None,
    reason: str | None = None,
    *,
    source: AuditSource = AuditSource.SERVICE,
) -> dict[str, Any]:
    return _change_status(app, name, actor, reason, source, pause=True)


def resume_schedule(
    app: ChordbeatCelery,
    name: str,
    actor: str | None = None,
    reason: str | None = None,
    *,
    source: AuditSource = AuditSource.SERVICE,
) -> dict[str, Any]:
    return _change_status(app, name, actor, reason, source, pause=False)


def _change_status(
    app: ChordbeatCelery, name: str, actor: str | None, reason: str | None, source: AuditSource, *, pause: bool
) -> dict[str, Any]:
    name, who, why = _name(name), _actor(actor, source), _reason(reason)

    def change(session: Session) -> tuple[dict[str, Any], Effects]:
        now = utcnow()
        effects = Effects()
        if pause:
            also = {"paused_by": who.name, "paused_reason": why, "paused_at": now}
            schedule, changed = change_status(session, name, decide_pause, now=now, also=also)
        else:
            # The paused slots not recorded yet (since the last recovery pass), before they are forgotten.
            record_paused_slots(session, find_schedule(session, name, lock=True), now=now)
            schedule, changed = change_status(session, name, decide_resume, now=now)
            # Backfills waited while it was paused: they go on now.
            effects = drive_backfills(session, schedule.id, now=now)
        if changed:
            # A pause of a paused schedule (a resume of an active one) changed nothing: no row
            # says it did. Whether it did is the compare-and-set's answer, not a second read.
            action = AuditAction.PAUSE if pause else AuditAction.RESUME
            who.record(session, action, name, reason=why, detail={"changed": True}, at=now)
        return {**one_schedule_json(session, schedule, now), "changed": changed}, effects

    what = f"{'pausing' if pause else 'resuming'} schedule {name!r}"
    result, effects = retried_transaction(app.settings.database_url, what, change)
    apply_effects(app, effects)
    _sync(app, name)
    return result


def trigger_schedule(
    app: ChordbeatCelery,
    name: str,
    payload: dict[str, Any] | None = None,
    actor: str | None = None,
    reason: str | None = None,
    *,
    source: AuditSource = AuditSource.SERVICE,
) -> dict[str, Any]:
    name, who, why = _name(name), _actor(actor, source), _reason(reason)
    payload = _payload(payload)
    run_key = f"{name}:manual:{uuid.uuid4().hex}"

    def start(session: Session) -> StartResult:
        now = utcnow()
        schedule = find_schedule(session, name, lock=True)
        result = start_execution(
            session, schedule, trigger=Trigger.MANUAL, now=now, payload=payload, run_key=run_key, locked=True
        )
        detail = None if result.skipped is None else {"skipped": result.skipped}
        who.record(session, AuditAction.TRIGGER, name, execution_id=result.execution_id, reason=why, detail=detail)
        return result

    result = retried_transaction(app.settings.database_url, f"starting a run of {name!r}", start)
    apply_effects(app, result.effects)
    if result.execution_id is None or result.skipped:
        return {"execution_id": None, "skipped": result.skipped}
    return {"execution_id": result.execution_id, "status": ExecutionStatus.IN_PROGRESS.value}


def cancel_execution(
    app: ChordbeatCelery,
    execution_id: int,
    actor: str | None = None,
    reason: str | None = None,
    *,
    source: AuditSource = AuditSource.SERVICE,
) -> dict[str, Any]:
    execution_id, who, why = _execution_id(execution_id), _actor(actor, source), _reason(reason)
    note = Note(who, AuditAction.CANCEL, why)
    effects = retried_transaction(
        app.settings.database_url,
        f"cancelling execution {execution_id}",
        lambda session: cancel_in_db(session, execution_id, now=utcnow(), reason=who.cancelled(why), note=note),
    )
    apply_effects(app, effects)
    return get_execution(app, execution_id)


def rerun_execution(
    app: ChordbeatCelery,
    execution_id: int,
    from_failed: bool = True,
    actor: str | None = None,
    reason: str | None = None,
    payload: dict[str, Any] | None = None,
    latest: bool = False,
    *,
    source: AuditSource = AuditSource.SERVICE,
) -> dict[str, Any]:
    """A new run of a failed or cancelled execution: its plan and payload (``payload``, when given,
    instead: a run that failed because of its payload would fail again), for its slot, from its
    first failed group (``from_failed``) or from the start; the new execution object, or
    ``{"execution_id": null, "skipped": ...}`` when the overlap policy started nothing. Its steps
    are those of the source's version, or with ``latest`` the current definition's."""
    execution_id, who, why = _execution_id(execution_id), _actor(actor, source), _reason(reason)
    from_failed, latest = _flag(from_failed, "from_failed"), _flag(latest, "latest")
    payload = _payload(payload)
    result = retried_transaction(
        app.settings.database_url,
        f"re-running execution {execution_id}",
        lambda session: start_rerun(
            session,
            execution_id,
            from_failed=from_failed,
            actor=who,
            reason=why,
            now=utcnow(),
            payload=payload,
            latest=latest,
        ),
    )
    apply_effects(app, result.effects)
    if result.execution_id is None or result.skipped:
        return {"execution_id": None, "skipped": result.skipped}
    return get_execution(app, result.execution_id)


def list_audit(
    app: ChordbeatCelery,
    schedule: str | None = None,
    limit: int = 50,
    execution_id: int | None = None,
    actor: str | None = None,
    action: str | None = None,
    since: str | None = None,
    until: str | None = None,
    before_id: int | None = None,
) -> list[dict[str, Any]]:
    """Who did what, newest first: one schedule's rows (kept after it is deleted), one
    execution's (``execution_id``, for its page), an actor's, an action's, a time range's, or
    all; ``before_id`` pages on."""
    schedule = None if schedule is None else _name(schedule, "schedule")
    limit = _limit(limit, MAX_AUDIT_LIMIT)
    wanted = audit_filter(
        schedule=schedule,
        execution_id=execution_id,
        actor=actor,
        action=action,
        since=since,
        until=until,
        before_id=before_id,
    )
    with transaction(app.settings.database_url, read_only=True) as session:
        return audit_rows(session, wanted, limit=limit)


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
    version: int | None = None,
) -> list[dict[str, Any]]:
    """Summaries, newest first; ``before_id``: only older runs (the cursor: the last id of a page);
    ``version``: only the runs of that definition version (needs ``schedule``). An answer is at
    most ``limit`` times ``summaries.MAX_SUMMARY_BYTES``."""
    schedule = None if schedule is None else _name(schedule, "schedule")
    wanted = _status(status)
    limit = _limit(limit, MAX_EXECUTION_LIST_LIMIT)
    before = None if before_id is None else _execution_id(before_id, "before_id")
    pinned = None if version is None else version_arg(version)
    if pinned is not None and schedule is None:
        raise InvalidArgument("version", "needs schedule (versions are numbered per schedule)")
    with transaction(app.settings.database_url, read_only=True) as session:
        return execution_summaries(
            session, schedule=schedule, status=wanted, limit=limit, before_id=before, version=pinned
        )


def list_slots(app: ChordbeatCelery, name: str, limit: int = 50) -> list[dict[str, Any]]:
    """What became of the schedule's recent due times, newest first: why a run did or did not happen."""
    name = _name(name)
    limit = _limit(limit)
    with transaction(app.settings.database_url, read_only=True) as session:
        rows = session.scalars(
            select(SlotRecord).where(SlotRecord.schedule_name == name).order_by(SlotRecord.id.desc()).limit(limit)
        ).all()
        created = find_schedule(session, name).created_at
        return [
            {
                "schedule": r.schedule_name,
                "nominal_at": iso(r.nominal_at),
                "trigger": r.trigger.value,
                "outcome": r.outcome.value,
                "execution_id": r.execution_id,
                "detail": r.detail,
                "recorded_at": iso(r.recorded_at),
                # A backfilled (or moved) slot from before the schedule was created: said, not a mistake.
                "before_schedule": r.nominal_at is not None and r.nominal_at < created,
            }
            for r in rows
        ]
