"""The JSON objects of the contract: schedule, execution and backfill objects, as the service tasks
answer them and the CLI and the dashboard show them.

A backfill object is a summary: counts and the first, last and next slot, which the database reads
out of the stored slot list; the list itself (up to 10,000 slots a backfill) is never loaded here.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import ColumnElement, Integer, Select, String, cast, func, select
from sqlalchemy.orm import InstrumentedAttribute, Session, defer

from celeryapp.domain.redaction import hide_env_values
from celeryapp.domain.times import iso
from celeryapp.execution.limit_steps import waiting_for
from celeryapp.interfaces.alerts import open_counts, silences_of
from celeryapp.interfaces.run_counts import run_counts
from models import (
    Activity,
    AlertSilence,
    Backfill,
    ExecutionStatus,
    Schedule,
    ScheduleExecution,
    ScheduleStatus,
    WorkerTask,
    WorkerTaskStatus,
)
from models.definitions import DefinitionFields, StepFields, definition_from


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


def one_schedule_json(session: Session, schedule: Schedule, now: datetime, *, runs: bool = False) -> dict[str, Any]:
    """One schedule's object; with ``runs`` (``get_schedule``'s), its kept runs counted as the
    dashboard counts them: a count over its executions, read for one schedule asked for, not for
    every apply, pause or resume, nor a list's page."""
    out = schedule_json(schedule, schedule.steps, alerting_of(session, [schedule.name], now)[schedule.name])
    if runs:
        out["runs"] = run_counts(session, schedule.id).to_json()
    return out


class ScheduleFields(DefinitionFields, Protocol):
    """A schedule's stored definition and state: a ``Schedule``, or a row of ``schedules``."""

    @property
    def status(self) -> ScheduleStatus: ...
    @property
    def run_count(self) -> int: ...
    @property
    def error_count(self) -> int: ...
    @property
    def current_retry(self) -> int: ...
    @property
    def last_error(self) -> str | None: ...
    @property
    def last_run_at(self) -> datetime | None: ...
    @property
    def retry_at(self) -> datetime | None: ...
    @property
    def next_run_at(self) -> datetime | None: ...
    @property
    def paused_by(self) -> str | None: ...
    @property
    def paused_reason(self) -> str | None: ...
    @property
    def paused_at(self) -> datetime | None: ...
    @property
    def version(self) -> int: ...


def schedule_json(schedule: ScheduleFields, steps: Iterable[StepFields], alerting: Alerting) -> dict[str, Any]:
    """A schedule object: from a ``Schedule`` and its ``steps``, or from their rows (a list's)."""
    out = definition_from(schedule, steps).to_json()
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
        version=schedule.version,
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
    waiting = [t.id for t in tasks if t.status is WorkerTaskStatus.WAITING_FOR_LIMIT]
    why = waiting_for(session, waiting)
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
        "version": execution.version,
        "payload": execution.payload,
        # Its steps' names by group, in the definition's order (the plan it runs).
        "groups": [[step["name"] for step in group] for group in execution.plan],
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
            # A step waiting for shared limits says which, and who holds them:
            # "warehouse 3/3 (held by #17 load, #19 export)".
            | ({"waiting_for": why.get(t.id, "")} if t.status is WorkerTaskStatus.WAITING_FOR_LIMIT else {})
            for t in tasks
        ],
    }


#: A backfill's runs by status, counted in one statement for a page of backfills.
_RUN_COUNTS = select(ScheduleExecution.backfill_id, ScheduleExecution.status, func.count()).group_by(
    ScheduleExecution.backfill_id, ScheduleExecution.status
)


def _slot_at(dialect: str, index: ColumnElement[int] | InstrumentedAttribute[int]) -> ColumnElement[str]:
    """The stored slot at ``index`` of the row's list (null past its end), as text."""
    if dialect == "postgresql":
        return func.json_extract_path_text(Backfill.slots, cast(index, String), type_=String)
    return func.json_extract(Backfill.slots, func.printf("$[%d]", index), type_=String)


def _summaries(dialect: str) -> Select[Backfill, int, str, str, str]:
    total = func.json_array_length(Backfill.slots, type_=Integer)
    return select(
        Backfill,
        total,
        _slot_at(dialect, cast(0, Integer)),
        _slot_at(dialect, total - 1),
        _slot_at(dialect, Backfill.started),
    ).options(defer(Backfill.slots, raiseload=True))


def schedule_backfills(session: Session, name: str, limit: int) -> list[dict[str, Any]]:
    """The schedule's last ``limit`` backfills (and catch-ups), newest first."""
    query = _summaries(session.get_bind().dialect.name)
    query = query.where(Backfill.schedule_name == name).order_by(Backfill.id.desc()).limit(limit)
    return _backfill_objects(session, query)


def backfill_json(session: Session, backfill_id: int) -> dict[str, Any] | None:
    """One backfill's object (``None``: there is no such backfill): what it is, and its progress
    (``total`` slots, ``started`` (run or passed over), runs ``running``, ``completed``,
    ``failed``, ``cancelled``, and ``skipped``: slots passed over because their run key had a
    run already)."""
    query = _summaries(session.get_bind().dialect.name).where(Backfill.id == backfill_id)
    objects = _backfill_objects(session, query)
    return objects[0] if objects else None


def _backfill_objects(session: Session, query: Select[Backfill, int, str, str, str]) -> list[dict[str, Any]]:
    # populate_existing: a backfill this session loaded before (a cancel) is read as it is now.
    rows = session.execute(query.execution_options(populate_existing=True)).all()
    counts: dict[int, dict[ExecutionStatus, int]] = defaultdict(dict)
    if rows:
        ids = [row[0].id for row in rows]
        for backfill_id, status, count in session.execute(_RUN_COUNTS.where(ScheduleExecution.backfill_id.in_(ids))):
            if backfill_id is not None:
                counts[backfill_id][ExecutionStatus(status)] = count
    return [
        _backfill_object(backfill, total, first, last, upcoming, counts[backfill.id])
        for backfill, total, first, last, upcoming in rows
    ]


def _backfill_object(
    backfill: Backfill,
    total: int,
    first: str | None,
    last: str | None,
    upcoming: str | None,
    runs: dict[ExecutionStatus, int],
) -> dict[str, Any]:
    return {
        "id": backfill.id,
        "schedule": backfill.schedule_name,
        "origin": backfill.origin.value,
        "mode": backfill.mode,
        "status": backfill.status.value,
        "start": iso(backfill.range_start),
        "end": iso(backfill.range_end),
        "first_slot": _slot(first),
        "last_slot": _slot(last),
        "max_concurrent": backfill.max_concurrent,
        "total": total,
        "started": backfill.started,
        "running": runs.get(ExecutionStatus.IN_PROGRESS, 0),
        "completed": runs.get(ExecutionStatus.COMPLETED, 0),
        "failed": runs.get(ExecutionStatus.FAILED, 0),
        "cancelled": runs.get(ExecutionStatus.CANCELLED, 0),
        "skipped": backfill.started - sum(runs.values()),
        "next_slot": _slot(upcoming) if backfill.started < total else None,
        "actor": backfill.actor,
        "reason": backfill.reason,
        "created_at": iso(backfill.created_at),
        "finished_at": iso(backfill.finished_at),
    }


def _slot(stored: str | None) -> str | None:
    return None if stored is None else iso(datetime.fromisoformat(stored))
