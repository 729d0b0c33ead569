"""Execution summaries (what a list shows of a run, read in two statements) and lists' size bounds.

A summary is the execution object without ``activities``, ``tasks`` and ``payload``, plus ``steps``:
``{"total": <steps in the plan>, "<activity status>": <steps whose latest attempt has it>, ...}``;
steps not started yet are in ``total`` only. A list never loads a plan, a payload or an activity
row: ``total`` is the run's stored ``step_count`` and the database counts the rest (lists that
carried activities answered megabytes: docs/performance.md). ``get_execution`` still gives the whole
object.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from sqlalchemy import ColumnElement, Select, and_, exists, func, literal_column, select
from sqlalchemy.orm import Session

from celeryapp.domain.limits import (
    ERROR_CHARS,
    LIST_TEXT_CHARS,
    MAX_DEFINITION_BYTES,
    MAX_ID,
    MAX_NAME_CHARS,
    MAX_STEPS,
)
from celeryapp.domain.times import iso
from models import ActivityStatus, ExecutionStatus, Trigger
from models.tables import ACTIVITIES, EXECUTIONS

_run, _activity = EXECUTIONS.c, ACTIVITIES.c

#: Characters of a run key (the column's length; the key is the schedule name and a suffix).
RUN_KEY_CHARS = 400
#: Bytes one character can take in Celery's JSON (``ensure_ascii``: a character outside the BMP
#: is two ``\\uXXXX`` escapes).
JSON_BYTES_PER_CHAR = 12


def _widest_fixed_part() -> int:
    """Bytes of a summary's JSON without its three free texts, every other value at its widest."""
    widest_time = "2026-11-24T10:00:00.000Z"
    summary = {
        "id": MAX_ID,
        "schedule": "",
        "status": max((s.value for s in ExecutionStatus), key=len),
        "trigger": max((t.value for t in Trigger), key=len),
        "run_key": "",
        "current_step_index": MAX_STEPS,
        "started_at": widest_time,
        "completed_at": widest_time,
        "error": "",
        "rerun_of": MAX_ID,
        "rerun_from_group": MAX_STEPS,
        "slot": widest_time,
        "version": MAX_ID,
        "steps": {"total": MAX_ID, **{s.value: MAX_ID for s in ActivityStatus}},
    }
    return len(json.dumps(summary))


#: Most bytes of one summary in an answer (Celery's JSON, separators included): a list's answer
#: is at most ``limit`` times this, whatever its runs carried.
MAX_SUMMARY_BYTES = _widest_fixed_part() + JSON_BYTES_PER_CHAR * (MAX_NAME_CHARS + RUN_KEY_CHARS + LIST_TEXT_CHARS)

#: Most bytes of one schedule object in Celery's JSON, so a ``list_schedules`` page is at most
#: ``limit`` times this. The definition is at most ``MAX_DEFINITION_BYTES`` of compact JSON:
#: Celery's separators (``", "``, ``": "``) lengthen it by half at most, and ``"<hidden>"`` for
#: one-character ``env`` values by a little more than double; three times covers both. The state
#: adds ``last_error`` (a run's error: a step's error and two names), every character escaped.
MAX_SCHEDULE_BYTES = 3 * MAX_DEFINITION_BYTES + JSON_BYTES_PER_CHAR * (ERROR_CHARS + 3 * MAX_NAME_CHARS) + 1024
#: Most bytes of the schedule objects of one ``list_schedules`` page (but its first, which is at
#: most ``MAX_SCHEDULE_BYTES``): a page of large definitions stops short of ``limit`` (thousands
#: of everyday schedules fit), and the caller reads on from its last name until an empty page.
MAX_SCHEDULE_PAGE_BYTES = 8 * 2**20


def schedules_page(schedules: Iterable[dict[str, Any]], limit_bytes: int | None = None) -> list[dict[str, Any]]:
    """The schedule objects that fit in a page: in order, while their JSON stays within
    ``limit_bytes`` (``MAX_SCHEDULE_PAGE_BYTES``), and always the first."""
    limit_bytes = MAX_SCHEDULE_PAGE_BYTES if limit_bytes is None else limit_bytes
    page: list[dict[str, Any]] = []
    used = 0
    for schedule in schedules:
        used += len(json.dumps(schedule)) + 2  # Celery's separator between items
        if page and used > limit_bytes:
            break
        page.append(schedule)
    return page


def step_total(dialect: str) -> ColumnElement[Any]:
    """Steps in a run's plan: its ``step_count``, or for a run started before that column existed,
    the steps of its plan (a JSON list of groups, each a list of steps) counted by the database."""
    if dialect == "postgresql":
        sql = "(SELECT COALESCE(SUM(json_array_length(g)), 0) FROM json_array_elements(schedule_executions.plan) g)"
    else:
        sql = "(SELECT COALESCE(SUM(json_array_length(value)), 0) FROM json_each(schedule_executions.plan))"
    # COALESCE evaluates the count only where step_count is null, on both databases.
    return func.coalesce(_run.step_count, literal_column(sql))


def summaries_query(
    dialect: str,
    *,
    schedule: str | None,
    status: ExecutionStatus | None,
    limit: int,
    before_id: int | None,
    version: int | None = None,
) -> Select[Any]:
    """Newest first; ``before_id``: only older runs (ids are never reused, so the pages of a
    cursor neither repeat nor skip a run, however many start meanwhile); ``version``: only the
    runs of that definition version (of ``schedule``)."""
    # One character more than shown, to know whether the error was cut.
    error = func.substr(_run.error, 1, LIST_TEXT_CHARS + 1)
    query = select(
        _run.id,
        _run.schedule_name,
        _run.status,
        _run.trigger,
        _run.run_key,
        _run.current_step_index,
        _run.started_at,
        _run.completed_at,
        error.label("error"),
        _run.rerun_of,
        _run.rerun_from_group,
        _run.slot,
        _run.version,
        step_total(dialect).label("total"),
    )
    if schedule is not None:
        query = query.where(_run.schedule_name == schedule)
    if status is not None:
        query = query.where(_run.status == status)
    if version is not None:
        query = query.where(_run.version == version)
    if before_id is not None:
        query = query.where(_run.id < before_id)
    return query.order_by(_run.id.desc()).limit(limit)


def _latest_attempts(ids: list[int]) -> Select[Any]:
    """Per run and activity status, how many steps' latest attempt has it."""
    later = ACTIVITIES.alias("later")
    newer_attempt = exists().where(
        and_(
            later.c.execution_id == _activity.execution_id,
            later.c.step_name == _activity.step_name,
            later.c.attempt > _activity.attempt,
        )
    )
    return (
        select(_activity.execution_id, _activity.status, func.count())
        .where(_activity.execution_id.in_(ids), ~newer_attempt)
        .group_by(_activity.execution_id, _activity.status)
    )


def execution_summaries(
    session: Session,
    *,
    schedule: str | None,
    status: ExecutionStatus | None,
    limit: int,
    before_id: int | None,
    version: int | None = None,
) -> list[dict[str, Any]]:
    dialect = session.get_bind().dialect.name
    query = summaries_query(
        dialect, schedule=schedule, status=status, limit=limit, before_id=before_id, version=version
    )
    rows = session.execute(query).all()
    steps: dict[int, dict[str, int]] = {row.id: {"total": int(row.total or 0)} for row in rows}
    if rows:
        for execution_id, activity_status, count in session.execute(_latest_attempts(list(steps))):
            steps[execution_id][ActivityStatus(activity_status).value] = count
    return [
        {
            "id": row.id,
            "schedule": row.schedule_name,
            "status": row.status.value,
            "trigger": row.trigger.value,
            "run_key": row.run_key,
            "current_step_index": row.current_step_index,
            "started_at": iso(row.started_at),
            "completed_at": iso(row.completed_at),
            "error": _cut(row.error),
            "rerun_of": row.rerun_of,
            "rerun_from_group": row.rerun_from_group,
            "slot": iso(row.slot),
            "version": row.version,
            "steps": steps[row.id],
        }
        for row in rows
    ]


def _cut(text: str | None) -> str | None:
    if text is None or len(text) <= LIST_TEXT_CHARS:
        return text
    return text[: LIST_TEXT_CHARS - 1] + "…"
