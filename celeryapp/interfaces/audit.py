"""The audit trail as the contract shows it: who did what, newest first."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from celeryapp.domain.times import iso
from models import AuditEvent

#: Most rows one ``list_audit`` call returns (the contract's bound).
MAX_AUDIT_LIMIT = 500


def audit_json(row: AuditEvent) -> dict[str, Any]:
    return {
        "id": row.id,
        "at": iso(row.at),
        "actor": row.actor,
        "source": row.source.value,
        "action": row.action.value,
        "schedule": row.schedule_name,
        "execution_id": row.execution_id,
        "reason": row.reason,
        "detail": row.detail,
    }


def source_said(row: dict[str, Any]) -> str:
    """A row's source as people read it: ``service (claims cli)`` when a service call's message
    claimed another source (recorded, never believed: anyone on the broker can claim it)."""
    claimed = (row.get("detail") or {}).get("claimed_source")
    return f"{row['source']} (claims {claimed})" if claimed else str(row["source"])


def audit_rows(session: Session, *, schedule: str | None, execution_id: int | None, limit: int) -> list[dict[str, Any]]:
    """Newest first; a schedule's rows (also those of a deleted schedule of that name), an
    execution's, or all. By id: rows are written in commit order closely enough, and ``at`` can
    repeat."""
    query = select(AuditEvent).order_by(AuditEvent.id.desc()).limit(limit)
    if schedule is not None:
        query = query.where(AuditEvent.schedule_name == schedule)
    if execution_id is not None:
        query = query.where(AuditEvent.execution_id == execution_id)
    return [audit_json(row) for row in session.scalars(query)]
