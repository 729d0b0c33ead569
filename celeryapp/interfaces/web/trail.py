"""Who did what, and how a schedule's runs ended, as the dashboard shows them: the activity panels
(audit rows by schedule or by execution), honest run counts, which runs completed with warnings,
and the links between a run and its re-runs. Reads only, each a bounded query."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from celeryapp.interfaces.audit import AuditFilter, audit_rows
from celeryapp.interfaces.display import WARNED_STEP
from celeryapp.states import AuditAction
from models import ActivityStatus, ExecutionStatus, ScheduleExecution
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


@dataclass(frozen=True)
class RunCounts:
    """A schedule's kept runs by how they ended (the stored run_count counts successes only,
    for total_repeats, so it alone read "runs 0, errors 1" after one failed run)."""

    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    running: int = 0

    @property
    def total(self) -> int:
        return self.completed + self.failed + self.cancelled + self.running

    def words(self) -> str:
        """``runs 3 (1 failed) · successful 2``."""
        others = [
            f"{n} {what}"
            for n, what in ((self.failed, "failed"), (self.cancelled, "cancelled"), (self.running, "running"))
            if n
        ]
        extra = f" ({', '.join(others)})" if others else ""
        return f"runs {self.total}{extra} · successful {self.completed}"


def run_counts(session: Session, schedule_id: int) -> RunCounts:
    rows = session.execute(
        select(ScheduleExecution.status, func.count())
        .where(ScheduleExecution.schedule_id == schedule_id)
        .group_by(ScheduleExecution.status)
    ).all()
    by_status = {ExecutionStatus(status): n for status, n in rows}
    return RunCounts(
        completed=by_status.get(ExecutionStatus.COMPLETED, 0),
        failed=by_status.get(ExecutionStatus.FAILED, 0),
        cancelled=by_status.get(ExecutionStatus.CANCELLED, 0),
        running=by_status.get(ExecutionStatus.IN_PROGRESS, 0),
    )


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
