"""Backfill objects: a backfill and how far it got, as the service tasks, the CLI and the
dashboard show it (plain JSON).

An object is a summary: counts and the first, last and next slot, which the database reads out
of the stored slot list; the list itself (up to 10,000 slots a backfill) is never loaded here.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Integer, Select, String, cast, func, select
from sqlalchemy.orm import InstrumentedAttribute, Session, defer

from celeryapp.domain.times import iso
from models import Backfill, ExecutionStatus, ScheduleExecution

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
    return _views(session, query)


def backfill_view(session: Session, backfill_id: int) -> dict[str, Any] | None:
    """One backfill's object (``None``: there is no such backfill): what it is, and its progress
    (``total`` slots, ``started`` (run or passed over), runs ``running``, ``completed``,
    ``failed``, ``cancelled``, and ``skipped``: slots passed over because their run key had a
    run already)."""
    query = _summaries(session.get_bind().dialect.name).where(Backfill.id == backfill_id)
    views = _views(session, query)
    return views[0] if views else None


def _views(session: Session, query: Select[Backfill, int, str, str, str]) -> list[dict[str, Any]]:
    # populate_existing: a backfill this session loaded before (a cancel) is read as it is now.
    rows = session.execute(query.execution_options(populate_existing=True)).all()
    counts: dict[int, dict[ExecutionStatus, int]] = defaultdict(dict)
    if rows:
        ids = [row[0].id for row in rows]
        for backfill_id, status, count in session.execute(_RUN_COUNTS.where(ScheduleExecution.backfill_id.in_(ids))):
            if backfill_id is not None:
                counts[backfill_id][ExecutionStatus(status)] = count
    return [
        _view(backfill, total, first, last, upcoming, counts[backfill.id])
        for backfill, total, first, last, upcoming in rows
    ]


def _view(
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
