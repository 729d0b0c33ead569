"""The audit trail's writer: one row per operator action or beat decision, in the caller's
transaction, so an action and its record commit or roll back together."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import insert
from sqlalchemy.orm import Session

from models.clock import clock
from models.states import AuditAction, AuditSource
from models.tables import AUDIT_EVENTS

#: Lengths of the stored columns; validated inputs never reach them, beat's own texts are cut.
ACTOR_CHARS = 100
REASON_CHARS = 500

#: The actor of beat's own decisions (retries, a schedule going dead, timeouts).
BEAT_ACTOR = "chordbeat"


@dataclass(frozen=True)
class Actor:
    """Who acts: a checked name (at most :data:`ACTOR_CHARS`) and where the request came from."""

    name: str
    source: AuditSource

    def cancelled(self, reason: str | None) -> str:
        """A cancelled execution's ``error``: who cancelled it, and why when they said."""
        text = f"cancelled by {self.name} ({self.source.value})"
        return text if reason is None else f"{text}: {reason}"

    def record(
        self,
        session: Session,
        action: AuditAction,
        schedule_name: str | None,
        *,
        execution_id: int | None = None,
        reason: str | None = None,
        detail: dict[str, Any] | None = None,
        at: datetime | None = None,
    ) -> None:
        record_audit(
            session,
            actor=self.name,
            source=self.source,
            action=action,
            schedule_name=schedule_name,
            execution_id=execution_id,
            reason=reason,
            detail=detail,
            at=at,
        )


@dataclass(frozen=True)
class Note:
    """An audit row to write if the change it goes with happens (a cancel of a run still going)."""

    actor: Actor
    action: AuditAction
    reason: str | None = None


#: Beat (and the recovery and housekeeping passes it starts) acting on its own.
BEAT = Actor(BEAT_ACTOR, AuditSource.BEAT)


def record_audit(
    session: Session,
    *,
    actor: str,
    source: AuditSource,
    action: AuditAction,
    schedule_name: str | None,
    execution_id: int | None = None,
    reason: str | None = None,
    detail: dict[str, Any] | None = None,
    at: datetime | None = None,
) -> None:
    session.execute(
        insert(AUDIT_EVENTS).values(
            at=at or clock.now(),
            actor=actor[:ACTOR_CHARS],
            source=source.value,
            action=action.value,
            schedule_name=schedule_name,
            execution_id=execution_id,
            reason=None if reason is None else reason[:REASON_CHARS],
            detail=detail,
        )
    )
