"""The audit row of an applied schedule file: who applied it (beat at its start, a person with
``chordbeat apply``) and what it changed."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session

from models.audit import REASON_CHARS, Actor
from models.states import AuditAction

if TYPE_CHECKING:
    from celeryapp.scheduling.schedule_file import FileDiff


def record_file_applied(session: Session, actor: Actor, path: str | Path, diff: FileDiff, reason: str | None) -> None:
    """One row for the whole file, in the apply's own transaction: the file and its record
    commit together. The reason is the caller's, else the diff's summary (its schedules' names,
    cut to a reason's length); the counts in the detail are whole."""
    detail = {
        "file": str(path)[:REASON_CHARS],
        "source": diff.source,
        **{kind: len(getattr(diff, kind)) for kind in ("added", "changed", "removed", "unchanged", "kept")},
    }
    if reason is None:
        summary = diff.summary()
        reason = summary if len(summary) <= REASON_CHARS else summary[: REASON_CHARS - 1] + "…"
    actor.record(session, AuditAction.FILE_APPLIED, None, reason=reason, detail=detail)
