"""Backfill objects: a backfill and how far it got, as the service tasks, the CLI and the
dashboard show it (plain JSON)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from celeryapp.domain.times import iso
from models import Backfill, ExecutionStatus, ScheduleExecution

#: A backfill's runs by status, counted in one statement for a page of backfills.
_RUN_COUNTS = select(ScheduleExecution.backfill_id, ScheduleExecution.status, func.count()).group_by(
    ScheduleExecution.backfill_id, ScheduleExecution.status
)


def backfill_views(session: Session, backfills: Sequence[Backfill]) -> list[dict[str, Any]]:
    """The backfills' objects, in the order given; their runs counted in one statement."""
    counts: dict[int, dict[ExecutionStatus, int]] = defaultdict(dict)
    if backfills:
        ids = [backfill.id for backfill in backfills]
        for backfill_id, status, count in session.execute(_RUN_COUNTS.where(ScheduleExecution.backfill_id.in_(ids))):
            if backfill_id is not None:
                counts[backfill_id][ExecutionStatus(status)] = count
    return [_view(backfill, counts[backfill.id]) for backfill in backfills]


def backfill_view(session: Session, backfill: Backfill) -> dict[str, Any]:
    """One backfill's object: what it is, and its progress (``total`` slots, ``started`` (run or
    passed over), runs ``running``, ``completed``, ``failed``, ``cancelled``, and ``skipped``:
    slots passed over because their run key had a run already)."""
    (view,) = backfill_views(session, [backfill])
    return view


def _view(backfill: Backfill, runs: dict[ExecutionStatus, int]) -> dict[str, Any]:
    slots = backfill.slots
    return {
        "id": backfill.id,
        "schedule": backfill.schedule_name,
        "origin": backfill.origin.value,
        "mode": backfill.mode,
        "status": backfill.status.value,
        "start": iso(backfill.range_start),
        "end": iso(backfill.range_end),
        "first_slot": _slot(slots[0]) if slots else None,
        "last_slot": _slot(slots[-1]) if slots else None,
        "max_concurrent": backfill.max_concurrent,
        "total": len(slots),
        "started": backfill.started,
        "running": runs.get(ExecutionStatus.IN_PROGRESS, 0),
        "completed": runs.get(ExecutionStatus.COMPLETED, 0),
        "failed": runs.get(ExecutionStatus.FAILED, 0),
        "cancelled": runs.get(ExecutionStatus.CANCELLED, 0),
        "skipped": backfill.started - sum(runs.values()),
        "next_slot": _slot(slots[backfill.started]) if backfill.started < len(slots) else None,
        "actor": backfill.actor,
        "reason": backfill.reason,
        "created_at": iso(backfill.created_at),
        "finished_at": iso(backfill.finished_at),
    }


def _slot(stored: str) -> str | None:
    return iso(datetime.fromisoformat(stored))
