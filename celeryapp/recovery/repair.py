"""What recovery repairs: a lost attempt run again (or its step failed), a queued attempt whose
message is gone sent again.

Every change is a compare-and-set; its effects are sent after commit (docs/architecture.md "Compare-and-set").
"""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from celeryapp.domain.decisions import decide_lost_attempt
from celeryapp.domain.definition import StepSpec
from celeryapp.domain.effects import Effects, GroupDispatch, StepDispatch
from celeryapp.execution.advancing import advance_execution
from celeryapp.execution.limit_steps import gate_group, release_attempt
from celeryapp.execution.runs import lock_schedule
from celeryapp.execution.steps import spec_of
from celeryapp.monitoring import metric_counts
from models import Activity, ActivityStatus, ExecutionStatus, ScheduleExecution, WorkerTask, WorkerTaskStatus
from models.session import affected

logger = logging.getLogger(__name__)


def requeue_attempt(session: Session, worker_task_id: int, attempt: int, *, reason: str, now: datetime) -> Effects:
    """An attempt's worker is gone: fail its activity, then run it again or, out of attempts (or past
    its timeout: a crash then is the timeout's hard kill, not bad luck), fail the step.

    Fenced by the attempt number, so a late message of the interrupted attempt finds nothing to
    claim, and two recoveries racing each other requeue once. The attempt is also fenced in Redis,
    so that if it is in fact still running (a frozen worker), it stops.
    """
    task = session.get(WorkerTask, worker_task_id)
    if task is None or task.attempt != attempt or task.status is not WorkerTaskStatus.PROCESSING:
        return Effects()
    execution = session.get_one(ScheduleExecution, task.execution_id)
    spec = spec_of(execution, task)
    verdict = decide_lost_attempt(
        attempt, spec.max_attempts, started_at=task.started_at, timeout_s=spec.timeout_s, now=now, reason=reason
    )
    # Locks in the documented order (docs/architecture.md, "Locks"): the worker task before its
    # activity; failing the step may end the run, so then the schedule and the run before both.
    fenced = (
        WorkerTask.id == worker_task_id,
        WorkerTask.attempt == attempt,
        WorkerTask.status == WorkerTaskStatus.PROCESSING,
    )
    if verdict.requeue:
        moved = affected(
            session,
            update(WorkerTask)
            .where(*fenced)
            .values(status=WorkerTaskStatus.QUEUED, attempt=attempt + 1, node=None, started_at=None, queued_at=now),
        )
        if not moved:
            return Effects()
        _fail_activity(session, task, attempt, verdict.error, now=now)
        logger.warning(
            "step %r of execution %s: %s; re-queued as attempt %s", task.step_name, execution.id, reason, attempt + 1
        )
        step = StepDispatch(execution.id, worker_task_id, attempt + 1, spec, execution.token)
        name = execution.schedule_name
        group = GroupDispatch(execution.id, task.step_index, (step,), requeue=True, schedule_name=name)
        # The lost attempt's slots go back (admitting the next waiters); the new one takes its own.
        sends = _released(session, spec, worker_task_id, attempt, now).merge(gate_group(session, group, now=now))
        metric_counts.count_requeue(session)  # last: after every lock this transaction takes
        sends.fenced.append((worker_task_id, attempt, execution.token))
        return sends
    if execution.schedule_id is not None:
        lock_schedule(session, execution.schedule_id)
    session.execute(select(ScheduleExecution.id).where(ScheduleExecution.id == execution.id).with_for_update())
    if not affected(session, delete(WorkerTask).where(*fenced)):
        return Effects()
    _fail_activity(session, task, attempt, verdict.error, now=now)
    logger.error("step %r of execution %s: %s; not run again", task.step_name, execution.id, verdict.error)
    sends = _released(session, spec, worker_task_id, attempt, now)
    effects = advance_execution(session, execution.id, task.step_index, now=now)
    effects.merge(sends)
    metric_counts.count_requeue(session)  # last: after every lock this transaction takes
    effects.fenced.append((worker_task_id, attempt, execution.token))
    return effects


def _released(session: Session, spec: StepSpec, worker_task_id: int, attempt: int, now: datetime) -> Effects:
    """A lost attempt's slots given back as recovery declares it lost (none read for a step using no limit)."""
    return release_attempt(session, worker_task_id, attempt, now=now) if spec.uses else Effects()


def _fail_activity(session: Session, task: WorkerTask, attempt: int, error: str, *, now: datetime) -> None:
    session.execute(
        update(Activity)
        .where(
            Activity.execution_id == task.execution_id,
            Activity.step_name == task.step_name,
            Activity.attempt == attempt,
            Activity.status == ActivityStatus.IN_PROGRESS,
        )
        .values(status=ActivityStatus.FAILED_WITH_ERROR, completed_at=now, error=error)
    )


def resend_queued(session: Session, worker_task_id: int, *, now: datetime) -> Effects:
    """Send again a queued attempt whose message is gone (Redis lost data, or a crash before publish).

    A second message for the same attempt is harmless: only one runner can claim it.
    """
    task = session.get(WorkerTask, worker_task_id)
    if task is None or task.status is not WorkerTaskStatus.QUEUED:
        return Effects()
    execution = session.get_one(ScheduleExecution, task.execution_id)
    if execution.status is not ExecutionStatus.IN_PROGRESS:
        return Effects()
    spec = spec_of(execution, task)
    session.execute(
        update(WorkerTask)
        .where(WorkerTask.id == worker_task_id, WorkerTask.status == WorkerTaskStatus.QUEUED)
        .values(queued_at=now)
    )
    step = StepDispatch(execution.id, worker_task_id, task.attempt, spec, execution.token)
    group = GroupDispatch(execution.id, task.step_index, (step,), requeue=True, schedule_name=execution.schedule_name)
    return Effects(dispatch=[group])
