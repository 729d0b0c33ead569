"""A failed or cancelled execution run again: a new execution with the source's stored plan and
payload (the steps that ran then, not the schedule's current definition), for the same slot,
from the first group that did not complete (or from the start), through the overlap policy."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from celeryapp.errors import InvalidTransition, NotFound
from celeryapp.execution.run_rows import Rerun, StartResult
from celeryapp.execution.runs import start_execution
from celeryapp.states import AuditAction
from models import ExecutionStatus, Schedule, ScheduleExecution, SlotRecord, Trigger
from models.audit import Actor
from models.definitions import definition_of

#: What can be run again: a run that ended without completing.
RERUNNABLE = (ExecutionStatus.FAILED, ExecutionStatus.CANCELLED)


def first_failed_group(execution: ScheduleExecution) -> int:
    """Where a re-run from the failed group starts (0-based): a run that failed or was cancelled
    in group g stays at g, the groups before it completed."""
    return max(0, min(execution.current_step_index, len(execution.plan) - 1))


def start_rerun(
    session: Session,
    source_id: int,
    *,
    from_failed: bool,
    actor: Actor,
    reason: str | None,
    now: datetime,
    payload: dict[str, Any] | None = None,
    latest: bool = False,
) -> StartResult:
    """Start the re-run of execution ``source_id`` (with ``payload`` instead of its own, when
    given) and write its audit row (also when the overlap policy skipped it: the operator asked);
    a changed payload is in the row, as the run's own is on the run. The steps are the source's
    (its pinned version's), or with ``latest`` the schedule's current definition's."""
    source = session.get(ScheduleExecution, source_id)
    if source is None:
        raise NotFound(f"execution {source_id} does not exist")
    if source.status not in RERUNNABLE:
        raise InvalidTransition(
            f"execution {source_id} is {source.status.value}; only a failed or cancelled execution can be re-run"
        )
    # Locked first, as everything that starts a run of the schedule does (the lock order).
    schedule = (
        None
        if source.schedule_id is None
        else session.scalar(select(Schedule).where(Schedule.id == source.schedule_id).with_for_update())
    )
    if schedule is None:
        raise NotFound(f"schedule {source.schedule_name!r} of execution {source_id} does not exist")
    plan, version = (definition_of(schedule).plan(), schedule.version) if latest else (source.plan, source.version)
    # The current definition may have fewer groups than the source: from its last at most.
    from_group = min(first_failed_group(source), len(plan) - 1) if from_failed else 0
    slot = session.scalar(
        select(SlotRecord.nominal_at).where(SlotRecord.execution_id == source_id).order_by(SlotRecord.id).limit(1)
    )
    result = start_execution(
        session,
        schedule,
        trigger=Trigger.MANUAL,
        run_key=f"{schedule.name}:rerun:{source_id}:{uuid.uuid4().hex}",
        now=now,
        nominal_at=slot,
        locked=True,
        rerun=Rerun(source_id, from_group, plan, dict(source.payload or {}) if payload is None else payload, version),
    )
    detail: dict[str, Any] = {"rerun_of": source_id, "from_group": from_group, "version": version}
    if payload is not None and payload != (source.payload or {}):
        detail["payload"] = payload
    if result.skipped is not None:
        detail["skipped"] = result.skipped
    actor.record(
        session,
        AuditAction.RERUN,
        schedule.name,
        execution_id=result.execution_id,
        reason=reason,
        detail=detail,
        at=now,
    )
    return result
