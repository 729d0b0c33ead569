"""The audit trail's writer: one row per operator action or beat decision, in the caller's
transaction, so an action and its record commit or roll back together."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import insert
from sqlalchemy.orm import Session

from celeryapp.clock import clock
from celeryapp.states import AuditAction, AuditSource
from models.tables import AUDIT_EVENTS

#: Lengths of the stored columns; validated inputs never reach them, beat's own texts are cut.
ACTOR_CHARS = 100
REASON_CHARS = 500

#: The actor of beat's own decisions (retries, a schedule going dead, timeouts).
BEAT_ACTOR = "chordbeat"

#: The source a service call's message claimed (its ``chordbeat_source`` header), while that call
#: runs. Anyone who can publish to the broker can send any header, so the row's ``source`` stays
#: ``service``; the claim is kept in its ``detail`` under ``claimed_source``, marked as the caller's
#: word.
_claimed_source: ContextVar[str | None] = ContextVar("claimed_source", default=None)
#: Longest claim kept (a header is the caller's to make as long as it likes).
CLAIMED_SOURCE_CHARS = 40


@contextmanager
def claimed_source(claim: str | None) -> Iterator[None]:
    """Rows written by the service call run inside keep ``claim`` in their detail."""
    # Printable characters only: it is shown in terminals and pages as it was sent.
    kept = None if claim is None else "".join(c for c in claim if c.isprintable())[:CLAIMED_SOURCE_CHARS]
    token = _claimed_source.set(kept)
    try:
        yield
    finally:
        _claimed_source.reset(token)


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
    claim = _claimed_source.get()
    if claim is not None and source is AuditSource.SERVICE:
        detail = {**(detail or {}), "claimed_source": claim}
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
