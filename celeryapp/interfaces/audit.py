"""The audit trail as the contract shows it: who did what, newest first."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from celeryapp.domain.limits import short_repr, type_name
from celeryapp.domain.times import iso
from celeryapp.errors import InvalidArgument
from celeryapp.interfaces.arguments import choice_arg, execution_id_arg, text_arg
from celeryapp.states import AuditAction
from models import AuditEvent
from models.audit import ACTOR_CHARS

#: Most rows one ``list_audit`` call returns (the contract's bound).
MAX_AUDIT_LIMIT = 500
#: Longest ``since``/``until`` taken: an ISO 8601 time with microseconds and offset is 32.
_TIME_CHARS = 40
_TIME_EXAMPLE = "e.g. 2026-11-28T06:00:00Z or 2026-11-28T07:00:00+01:00"


@dataclass(frozen=True)
class AuditFilter:
    """Which rows a reader wants, each part checked (``None``: any)."""

    schedule: str | None = None
    execution_id: int | None = None
    actor: str | None = None
    action: AuditAction | None = None
    #: Rows at or after ``since`` and before ``until`` (UTC).
    since: datetime | None = None
    until: datetime | None = None
    #: The cursor: only rows with a smaller id (the next page of a newest-first list).
    before_id: int | None = None


def action_arg(value: Any) -> AuditAction | None:
    """One of the recorded actions, spelled exactly (``Pause`` or a look-alike letter is no action)."""
    return choice_arg(value, AuditAction, "action")


def instant_arg(value: Any, field: str) -> datetime | None:
    """An ISO 8601 time that says its UTC offset (one without is read differently by each host)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidArgument(
            field, f"must be an ISO 8601 time with its UTC offset ({_TIME_EXAMPLE}), got {type_name(value)}"
        )
    if len(value) > _TIME_CHARS:
        raise InvalidArgument(field, f"must be an ISO 8601 time ({_TIME_EXAMPLE}), got {len(value)} characters")
    try:
        parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise InvalidArgument(field, f"is not an ISO 8601 time ({_TIME_EXAMPLE}): {short_repr(value)}") from None
    if parsed.tzinfo is None:
        raise InvalidArgument(field, f"must say its UTC offset ({_TIME_EXAMPLE}), got {short_repr(value)}")
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        raise InvalidArgument(field, f"is out of range: {short_repr(value)}") from None


def audit_filter(
    *,
    schedule: str | None = None,
    execution_id: Any = None,
    actor: Any = None,
    action: Any = None,
    since: Any = None,
    until: Any = None,
    before_id: Any = None,
) -> AuditFilter:
    """The filters as a caller sent them, checked; a refusal names the argument. ``schedule`` is
    checked by the caller (the service's name rule)."""
    found = AuditFilter(
        schedule=schedule,
        execution_id=None if execution_id is None else execution_id_arg(execution_id),
        actor=None if actor is None else text_arg(actor, "actor", ACTOR_CHARS),
        action=action_arg(action),
        since=instant_arg(since, "since"),
        until=instant_arg(until, "until"),
        before_id=None if before_id is None else execution_id_arg(before_id, "before_id", "an audit row id"),
    )
    if found.since is not None and found.until is not None and found.until <= found.since:
        raise InvalidArgument("until", f"must be after since ({iso(found.since)}), got {iso(found.until)}")
    return found


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


def audit_rows(session: Session, wanted: AuditFilter, *, limit: int) -> list[dict[str, Any]]:
    """Newest first; a schedule's rows (also those of a deleted schedule of that name), an
    execution's, an actor's, an action's, a time range's, or all (file applies, which name no
    schedule, among them). By id: rows are written in commit order closely enough, and ``at`` can
    repeat. Each filter has an index to walk (actor, action: with the id; time: ``at``)."""
    query = select(AuditEvent).order_by(AuditEvent.id.desc()).limit(limit)
    if wanted.schedule is not None:
        query = query.where(AuditEvent.schedule_name == wanted.schedule)
    if wanted.execution_id is not None:
        query = query.where(AuditEvent.execution_id == wanted.execution_id)
    if wanted.actor is not None:
        query = query.where(AuditEvent.actor == wanted.actor)
    if wanted.action is not None:
        query = query.where(AuditEvent.action == wanted.action)
    if wanted.since is not None:
        query = query.where(AuditEvent.at >= wanted.since)
    if wanted.until is not None:
        query = query.where(AuditEvent.at < wanted.until)
    if wanted.before_id is not None:
        query = query.where(AuditEvent.id < wanted.before_id)
    return [audit_json(row) for row in session.scalars(query)]
