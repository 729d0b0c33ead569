"""The audit row of the schedule file beat applied when it started: what it changed, by beat."""

from __future__ import annotations

import logging
from pathlib import Path

from celeryapp.scheduling.schedule_file import FileDiff
from models.audit import BEAT, REASON_CHARS
from models.session import retried_transaction
from models.states import AuditAction

logger = logging.getLogger(__name__)


def record_file_applied(database_url: str, path: str | Path, diff: FileDiff) -> None:
    """One row for the whole file (its schedules' names are in the summary, cut to a reason's
    length; the counts are whole). Written after the apply committed, in a transaction of its own:
    a failure here is logged and costs the file nothing."""
    detail = {
        "file": str(path)[:REASON_CHARS],
        "source": diff.source,
        **{kind: len(getattr(diff, kind)) for kind in ("added", "changed", "removed", "unchanged", "kept")},
    }
    summary = diff.summary()
    reason = summary if len(summary) <= REASON_CHARS else summary[: REASON_CHARS - 1] + "…"
    try:
        retried_transaction(
            database_url,
            "recording the schedule file's audit row",
            lambda session: BEAT.record(session, AuditAction.FILE_APPLIED, None, reason=reason, detail=detail),
        )
    except Exception:
        logger.exception("beat: the audit row of schedule file %s was not written", path)
