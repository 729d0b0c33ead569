"""What "runs" means wherever a schedule's run count is shown (the dashboard's schedule page, the
CLI's ``show``, the schedule object's ``runs``): every kept execution of the schedule, whatever
started it (regular, manual, retry, catch-up, backfill), by how it ended.

The stored ``run_count`` and ``error_count`` are no such count: they are the counters the repeat
limit and the retries decide by, which leave backfill runs out on purpose, so "runs" is never
read from them."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from models import ExecutionStatus, ScheduleExecution


@dataclass(frozen=True)
class RunCounts:
    """A schedule's kept runs by how they ended."""

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

    def to_json(self) -> dict[str, int]:
        return {"total": self.total, **asdict(self)}

    @classmethod
    def from_json(cls, counts: dict[str, Any]) -> RunCounts:
        return cls(**{field: int(counts.get(field, 0)) for field in ("completed", "failed", "cancelled", "running")})


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
