"""What a schedule keeps of a run that ended: whether its pending retry already started, the
decided retry state and status written guarded on what the decision read, and the log line."""

from __future__ import annotations

import logging
from datetime import datetime
from functools import partial
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from celeryapp.domain.decisions import AfterExecution, ScheduleState
from celeryapp.domain.times import iso
from celeryapp.execution.run_rows import execution_with_key
from celeryapp.monitoring.alert_outbox import raise_alert
from models import AlertKind, ExecutionStatus, Schedule, ScheduleStatus
from models.audit import BEAT
from models.session import affected
from models.states import AuditAction

logger = logging.getLogger(__name__)


def pending_retry_started(session: Session, state: ScheduleState, key: str | None, now: datetime) -> bool:
    """Whether the pending retry's run exists; only asked once the retry is due."""
    if state.retry_at is None or key is None or state.retry_at > now:
        return False
    return execution_with_key(session, key) is not None


def write_after_run(
    session: Session, schedule_id: int, state: ScheduleState, after: AfterExecution, *, now: datetime
) -> bool:
    """Write the decided retry state and status, guarded on what the decision read."""
    changes: dict[str, Any] = {}
    if (after.current_retry, after.retry_at) != (state.current_retry, state.retry_at):
        changes.update(current_retry=after.current_retry, retry_at=after.retry_at)
    if after.status is not state.status:
        changes.update(status=after.status, retry_at=None, next_run_at=None, buffered=False)
    if not changes:
        return True
    changes["changed_at"] = now  # the beat entry follows: the incremental reconcile must see it
    return bool(
        affected(
            session,
            update(Schedule)
            .where(
                Schedule.id == schedule_id,
                Schedule.status == state.status,
                Schedule.current_retry == state.current_retry,
                Schedule.retry_at.is_not_distinct_from(state.retry_at),
            )
            .values(**changes)
            .execution_options(synchronize_session=False),
        )
    )


def log_after_run(
    session: Session,
    name: str,
    execution_id: int,
    state: ScheduleState,
    after: AfterExecution,
    *,
    run_count: int,
    is_pending_retry: bool,
    ended: ExecutionStatus,
    now: datetime,
) -> None:
    """Log what the end of a run did to its schedule; beat's decisions (done, dead, a retry) also
    get their audit row, in the transaction that writes them."""
    audit = partial(BEAT.record, session, schedule_name=name, execution_id=execution_id, at=now)
    if after.status is ScheduleStatus.DONE:
        logger.info("schedule %r is done after %s runs", name, run_count)
        audit(AuditAction.DONE, reason=f"repeat limit reached after {run_count} runs")
    elif after.status is ScheduleStatus.DEAD:
        failures = state.current_retry + 1
        logger.error("schedule %r is dead: %s consecutive failures", name, failures)
        audit(AuditAction.DEAD, reason=f"{failures} consecutive failures", detail={"failures": failures})
        message = f"{name} is dead after {failures} consecutive failures; nothing runs until it is resumed"
        raise_alert(
            session, schedule_name=name, kind=AlertKind.DEAD, message=message, now=now, execution_id=execution_id
        )
    elif after.counted and after.retry_at is not None:
        logger.info("schedule %r: retry %s at %s", name, after.current_retry, iso(after.retry_at))
        detail = {"retry": after.current_retry, "at": iso(after.retry_at)}
        audit(
            AuditAction.RETRY_SCHEDULED, reason=f"retry {after.current_retry} at {iso(after.retry_at)}", detail=detail
        )
    elif ended is ExecutionStatus.FAILED and state.retry_at is not None and not is_pending_retry:
        logger.info("schedule %r: retry %s is already pending; no retry added", name, state.current_retry)
