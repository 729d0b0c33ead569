"""Who did what, as the dashboard shows it: the activity panels (audit rows by schedule or by
execution), which runs completed with warnings, and the links between a run and its re-runs.
Reads only, each a bounded query. (How many runs a schedule has: interfaces/run_counts.py.)"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from celeryapp.interfaces.audit import AuditFilter, audit_rows
from celeryapp.interfaces.display import WARNED_STEP
from celeryapp.states import AuditAction
from models import ActivityStatus, ScheduleExecution
from models.tables import Activity

#: Rows in an activity panel, newest first.
AUDIT_SHOWN = 20
#: Re-runs of one execution linked from its page.
RERUNS_SHOWN = 10
#: Step outcomes that make a completed run "completed with warnings".
WARNING_STEPS = tuple(ActivityStatus(state) for state in sorted(WARNED_STEP))


def audit_trail(
    session: Session, *, schedule: str | None = None, execution_id: int | None = None
) -> list[dict[str, Any]]:
    """A schedule's or an execution's trail as ``list_audit`` answers it, newest first."""
    if schedule is None and execution_id is None:
        return []
    return audit_rows(session, AuditFilter(schedule=schedule, execution_id=execution_id), limit=AUDIT_SHOWN)


def cancel_of(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The row of who cancelled the run, among its trail."""
    return next((r for r in rows if r["action"] == AuditAction.CANCEL.value), None)


def warned_runs(session: Session, execution_ids: Sequence[int]) -> set[int]:
    """Which of these runs have a step that completed with a warning or a tolerated error."""
    if not execution_ids:
        return set()
    return set(
        session.scalars(
            select(Activity.execution_id)
            .where(Activity.execution_id.in_(execution_ids), Activity.status.in_(WARNING_STEPS))
            .distinct()
        ).all()
    )


def reruns_of(session: Session, execution: ScheduleExecution) -> list[int]:
    """The re-runs started from this run: later runs of the same schedule (an index range on
    (schedule_id, id), as there is no index on rerun_of)."""
    if execution.schedule_id is None:
        return []
    return list(
        session.scalars(
            select(ScheduleExecution.id)
            .where(
                ScheduleExecution.schedule_id == execution.schedule_id,
                ScheduleExecution.id > execution.id,
                ScheduleExecution.rerun_of == execution.id,
            )
            .order_by(ScheduleExecution.id)
            .limit(RERUNS_SHOWN)
        ).all()
    )
