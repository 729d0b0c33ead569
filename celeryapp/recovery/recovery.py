"""Recovery: nothing is lost or stuck when workers crash, messages vanish or Redis loses data.

Runs periodically (``chordbeat.recover``); a starting worker recovers its own node's steps
(:mod:`celeryapp.recovery.node_start`). Every repair goes through the same compare-and-set
transitions as normal work, so racing a slow worker or a second recovery is harmless.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial

import redis
from redis.exceptions import LockError
from sqlalchemy import and_, exists, select
from sqlalchemy.orm import Session

from celeryapp.domain.effects import Effects
from celeryapp.domain.names import PREFIX, STEPS_QUEUE, runner_task_id
from celeryapp.execution.advancing import advance_execution
from celeryapp.execution.backfills import backfilling_schedules, cancel_backfills_of, drive_backfills
from celeryapp.execution.runs import cancel_execution, lock_schedule
from celeryapp.messaging import keys, unacked
from celeryapp.messaging.redis_client import get_redis
from celeryapp.recovery.database_rollback import check_database_went_back
from celeryapp.recovery.heartbeat_trust import PRIMARY_KEY, heartbeats_trusted
from celeryapp.recovery.limit_waits import settle_waiting_limits
from celeryapp.recovery.lost_claims import live_attempts, note_running_unclaimed
from celeryapp.recovery.paused_slots import record_all_paused
from celeryapp.recovery.repair import requeue_attempt, resend_queued
from celeryapp.runtime import Runtime
from celeryapp.scheduling.beat_entries import reconcile
from celeryapp.states import AuditAction
from celeryapp.worker.dispatch import apply_effects
from models import (
    Activity,
    ExecutionStatus,
    ScheduleExecution,
    ScheduleStep,
    WorkerTask,
    WorkerTaskStatus,
    transaction,
    utcnow,
)
from models.audit import BEAT, Note
from models.session import retried_transaction

logger = logging.getLogger(__name__)

#: A queued attempt without a dispatch marker is re-sent only after this long (publish races).
RESEND_GRACE_S = 5.0
#: Most messages recovery reads from the step queues to find one that vanished; more is a backlog.
MAX_QUEUE_SCAN = 1000
#: Executions with nothing queued or running are advanced after this long (the chord body is faster).
STUCK_GRACE_S = 2.0
#: Present while Redis keeps its data; its absence means Redis restarted empty or failed over.
EPOCH_KEY = f"{PREFIX}:epoch"
#: Held by the recovery pass running in the deployment (see :func:`recover`).
PASS_LEASE_KEY = f"{PREFIX}:recovery:lease"


@dataclass
class RecoveryReport:
    requeued: list[int] = field(default_factory=list)
    resent: list[int] = field(default_factory=list)
    unstuck: list[int] = field(default_factory=list)
    timed_out: list[int] = field(default_factory=list)
    redis_reset: bool = False
    #: Beat entries the rebuild after a reset wrote or removed: none on a fresh start (a Redis that
    #: never held any, or an empty database), which is then no repair to warn of.
    entries_rebuilt: list[str] = field(default_factory=list)
    #: The database went back less than a heartbeat TTL ago: nothing was repaired (database_rollback).
    repairs_paused: bool = False
    #: Paused schedules whose passed slots were recorded (routine: not a repair, not logged).
    paused_slots: list[str] = field(default_factory=list)
    #: Schedules one of whose running backfills started a run here (a crash or a resume between
    #: two of its runs; routine, not logged).
    backfills: list[int] = field(default_factory=list)
    #: Shared limits whose waiters this pass admitted (a rate's token came back; routine, not logged).
    limits_settled: list[str] = field(default_factory=list)
    #: Another pass held the lease: this one did nothing.
    skipped: bool = False

    @property
    def empty(self) -> bool:
        return not (
            self.requeued
            or self.resent
            or self.unstuck
            or self.timed_out
            or self.entries_rebuilt
            or self.repairs_paused
        )


def _apply(app: Runtime, effects: Effects) -> None:
    try:
        apply_effects(app, effects)
    except Exception:
        # The database already says what must happen; the next pass sends it again.
        logger.exception("recovery could not send its repairs; the next pass retries")


def _repair(app: Runtime, what: str, repair: Callable[[Session], Effects]) -> Effects:
    """One item's repair in its own transaction. A failure (a corrupt plan, an overflow) is logged
    loudly and skipped: one bad row must not stop the pass for every other run."""
    try:
        effects = retried_transaction(app.settings.database_url, f"recovery: repairing {what}", repair)
    except Exception:
        logger.exception("recovery: repairing %s failed; skipped, the other repairs go on", what)
        return Effects()
    _apply(app, effects)
    return effects


def recover_stale_steps(app: Runtime, now: datetime, report: RecoveryReport) -> None:
    """Re-queue processing attempts whose heartbeat expired."""
    settings = app.settings
    query = (
        select(WorkerTask.id, WorkerTask.attempt, ScheduleExecution.token, WorkerTask.node)
        .join(ScheduleExecution, ScheduleExecution.id == WorkerTask.execution_id)
        .where(
            WorkerTask.status == WorkerTaskStatus.PROCESSING,
            WorkerTask.started_at < now - timedelta(seconds=settings.heartbeat_ttl_s),
        )
    )
    with transaction(settings.database_url, read_only=True) as session:
        candidates = session.execute(query).all()
    if not candidates:
        return
    client = get_redis(settings.broker_url)
    with client.pipeline(transaction=False) as pipe:
        # Asked of the server that answers the heartbeats: a failover since heartbeats_trusted
        # looked would judge them by a clock not yet given its grace.
        pipe.get(PRIMARY_KEY)
        pipe.info("server")
        for task_id, attempt, token, _node in candidates:
            pipe.exists(keys.heartbeat_key(task_id, attempt, token))
        seen, server, *alive = pipe.execute()
    if seen is not None and seen != server["run_id"]:
        logger.warning("recovery: the Redis primary changed during the pass; nothing re-queued in it")
        return
    for (task_id, attempt, token, owner), beating in zip(candidates, alive, strict=True):
        if not beating:
            requeue_lost(app, task_id, attempt, token, f"worker lost: no heartbeat from {owner}", now, report)


def requeue_lost(
    app: Runtime, task_id: int, attempt: int, token: int, reason: str, now: datetime, report: RecoveryReport
) -> None:
    """Re-queue (or fail, out of attempts) an attempt whose worker is gone; a no-op if it moved on.
    Not while a later attempt of it runs: the database lost that attempt's re-queue (lost_claims)."""
    (running,) = live_attempts(get_redis(app.settings.broker_url), [(task_id, attempt, token)], from_next=True)
    if running is not None:
        note_running_unclaimed(task_id, attempt, running, "processing")
        return
    effects = _repair(
        app,
        f"worker task {task_id}",
        partial(requeue_attempt, worker_task_id=task_id, attempt=attempt, reason=reason, now=now),
    )
    if effects.fenced:
        report.requeued.append(task_id)


def resend_lost_messages(app: Runtime, now: datetime, report: RecoveryReport) -> None:
    settings = app.settings
    with transaction(settings.database_url, read_only=True) as session:
        queued = session.execute(
            select(
                WorkerTask.execution_id,
                WorkerTask.id,
                WorkerTask.attempt,
                WorkerTask.queued_at,
                ScheduleExecution.token,
            )
            .join(ScheduleExecution, ScheduleExecution.id == WorkerTask.execution_id)
            .where(
                WorkerTask.status == WorkerTaskStatus.QUEUED,
                WorkerTask.queued_at < now - timedelta(seconds=RESEND_GRACE_S),
            )
        ).all()
    if not queued:
        return
    client = get_redis(settings.broker_url)
    with client.pipeline(transaction=False) as pipe:
        for _execution_id, task_id, attempt, _queued_at, token in queued:
            # On its way (marker); in a worker's hands until its claim commits (pickup lease).
            pipe.exists(keys.dispatch_marker_key(task_id, attempt, token))
            pipe.exists(keys.pickup_key(task_id, attempt, token))
        found = pipe.execute()
    running = live_attempts(client, [(task_id, attempt, token) for _e, task_id, attempt, _q, token in queued])
    lost, on_its_way, waited = [], {}, set()
    for (execution_id, task_id, attempt, queued_at, token), marked, picked, beating in zip(
        queued, found[::2], found[1::2], running, strict=True
    ):
        if beating is not None:
            note_running_unclaimed(task_id, attempt, beating, "queued")
        elif not marked and not picked:
            lost.append(task_id)
        elif not picked:
            runner_id = runner_task_id(execution_id, task_id, attempt, token)
            on_its_way[runner_id] = task_id
            if queued_at is not None and queued_at < now - timedelta(seconds=settings.heartbeat_ttl_s):
                waited.add(runner_id)
    # A message on its way may in fact have been taken by a worker that died before noting its
    # pickup: kombu holds it as unacknowledged until its visibility timeout. A live worker notes
    # the pickup within milliseconds of taking a message; one silent for a heartbeat's TTL is
    # lost, as for a running step. A second message is harmless: only one runner can claim.
    taken = unacked.taken_before(client, on_its_way, now.timestamp() - settings.heartbeat_ttl_s)
    stranded = [on_its_way[t] for t in taken]
    # Or it was popped by a worker that never got the answer (cut off mid-read, then killed): in
    # no queue, not unacknowledged, only its marker says it is on its way, for 6 hours.
    unaccounted = waited - set(taken)
    popped = (
        [on_its_way[t] for t in unacked.vanished(client, unaccounted, _step_queues(app), MAX_QUEUE_SCAN) or ()]
        if unaccounted
        else []
    )
    for task_id in lost + stranded + popped:
        effects = _repair(app, f"worker task {task_id}", partial(resend_queued, worker_task_id=task_id, now=now))
        if effects.dispatch:
            report.resent.append(task_id)
            why = (
                "taken by a worker that died before running it"
                if task_id in stranded
                else "in no queue nor a worker's hands"
                if task_id in popped
                else "gone"
            )
            logger.warning("worker task %s was queued but its message is %s; sent again", task_id, why)
    # Only once sent again: kombu must not also put the old message back (a crash before this
    # line costs a duplicate, not a stranded run).
    unacked.forget(client, taken.values())


def _step_queues(app: Runtime) -> set[str]:
    with transaction(app.settings.database_url, read_only=True) as session:
        return {STEPS_QUEUE, *(q for q in session.scalars(select(ScheduleStep.queue).distinct()) if q)}


def time_out_executions(app: Runtime, now: datetime, report: RecoveryReport) -> None:
    with transaction(app.settings.database_url, read_only=True) as session:
        overdue = session.execute(
            select(ScheduleExecution.id, ScheduleExecution.started_at, ScheduleExecution.deadline_at).where(
                ScheduleExecution.status == ExecutionStatus.IN_PROGRESS,
                ScheduleExecution.deadline_at < now,
            )
        ).all()
    for execution_id, started_at, deadline_at in overdue:
        assert deadline_at is not None  # selected by deadline_at < now
        limit = (deadline_at - started_at).total_seconds()
        effects = _repair(
            app,
            f"execution {execution_id}",
            partial(
                cancel_execution,
                execution_id=execution_id,
                now=now,
                status=ExecutionStatus.FAILED,
                reason=f"execution timed out after {limit:g}s",
                note=Note(BEAT, AuditAction.TIMED_OUT, f"no end within its timeout of {limit:g}s"),
            ),
        )
        if effects.cancelled:
            report.timed_out.append(execution_id)
            logger.warning("execution %s timed out after %gs; cancelled and failed", execution_id, limit)


def unstick_executions(app: Runtime, now: datetime, report: RecoveryReport) -> None:
    """In-progress executions with nothing queued or running, and no progress for a while: their
    advancement was lost.

    The grace counts from the last progress (a step ending), not from the start: under load a
    long run's advancement may still be queued a moment after its last step ended.
    """
    since = now - timedelta(seconds=STUCK_GRACE_S)
    active_task = exists().where(
        WorkerTask.execution_id == ScheduleExecution.id,
        WorkerTask.status != WorkerTaskStatus.WAITING,
    )
    recent_progress = exists().where(Activity.execution_id == ScheduleExecution.id, Activity.completed_at >= since)
    with transaction(app.settings.database_url, read_only=True) as session:
        stuck = session.execute(
            select(ScheduleExecution.id, ScheduleExecution.current_step_index).where(
                and_(
                    ScheduleExecution.status == ExecutionStatus.IN_PROGRESS,
                    ScheduleExecution.started_at < since,
                    ~active_task,
                    ~recent_progress,
                )
            )
        ).all()
    for execution_id, step_index in stuck:
        effects = _repair(
            app,
            f"execution {execution_id}",
            partial(advance_execution, execution_id=execution_id, step_index=step_index, now=now),
        )
        if effects.dispatch or effects.ended:
            report.unstuck.append(execution_id)
            logger.warning("execution %s was stuck after group %s; advanced by recovery", execution_id, step_index)


def check_redis_epoch(app: Runtime, report: RecoveryReport) -> None:
    """Rebuild beat entries at once when Redis lost its data (instead of at the next reconcile)."""
    client = get_redis(app.settings.redbeat_url)
    if client.set(EPOCH_KEY, utcnow().isoformat(), nx=True):
        report.redis_reset = True
        changes = reconcile(app, full=True)
        report.entries_rebuilt = changes.written + changes.removed


def top_up_backfills(app: Runtime, now: datetime, report: RecoveryReport) -> None:
    """Start what running backfills may start: each run's end starts the next in its own
    transaction, so only a crash between the two (or a start that failed) leaves one waiting.
    The backfills of a deleted schedule are cancelled."""

    def backfilling(session: Session) -> list[int]:
        cancel_backfills_of(session, None, now=now)
        return backfilling_schedules(session)

    for schedule_id in retried_transaction(app.settings.database_url, "recovery: backfills", backfilling):

        def top_up(session: Session, schedule_id: int = schedule_id) -> Effects:
            lock_schedule(session, schedule_id)
            return drive_backfills(session, schedule_id, now=now)

        if _repair(app, f"the backfills of schedule {schedule_id}", top_up).dispatch:
            report.backfills.append(schedule_id)


def recover(app: Runtime, *, now: datetime | None = None) -> RecoveryReport:
    """One recovery pass; none while another holds the pass's lease.

    Beat sends a pass every recovery interval. Over a large backlog (100,000 queued steps: the
    lost-message check alone took longer than the interval) passes overlapped, one in each pool
    process, and the steps they were looking after waited for them (docs/scaling.md). The lease
    lives one interval and is renewed between the pass's parts, so a worker killed in a pass
    delays the next one by an interval at most. Without Redis the pass goes on without it.
    """
    client = get_redis(app.settings.broker_url)
    lease = client.lock(
        PASS_LEASE_KEY, timeout=max(1.0, app.settings.recovery_interval_s), blocking=False, thread_local=False
    )
    try:
        if not lease.acquire():
            logger.info("recovery: another pass is running; this one does nothing")
            return RecoveryReport(skipped=True)
    except redis.RedisError:
        lease = None

    def renew() -> None:
        if lease is not None:
            with contextlib.suppress(LockError, redis.RedisError):  # lost or Redis away: overlap, as before
                lease.reacquire()

    try:
        return _one_pass(app, now or utcnow(), renew)
    finally:
        if lease is not None:
            with contextlib.suppress(LockError, redis.RedisError):
                lease.release()


def _one_pass(app: Runtime, now: datetime, renew: Callable[[], None]) -> RecoveryReport:
    report = RecoveryReport()
    try:
        check_redis_epoch(app, report)
    except redis.RedisError:
        logger.exception("recovery: Redis unreachable; database repairs go on")
    try:
        report.repairs_paused = check_database_went_back(app)
    except redis.RedisError:
        logger.exception("recovery: Redis unreachable; whether the database went back is checked next time")
    if report.repairs_paused:
        logger.warning("recovery: %s", report)
        return report
    time_out_executions(app, now, report)
    renew()
    try:
        if heartbeats_trusted(app):
            recover_stale_steps(app, now, report)
            renew()
        resend_lost_messages(app, now, report)
    except redis.RedisError:
        logger.exception("recovery: Redis unreachable; lost workers and messages are looked for next time")
    renew()
    unstick_executions(app, now, report)
    renew()
    report.limits_settled = settle_waiting_limits(app, now=now)
    report.paused_slots = record_all_paused(app.settings.database_url, now=now)
    top_up_backfills(app, now, report)
    if not report.empty:
        logger.warning("recovery: %s", report)
    elif report.redis_reset:
        # Every fresh start (a new Redis, `make run`) meets no epoch mark: nothing lost, nothing to warn of.
        logger.info("recovery: first pass on this Redis (no epoch mark yet); beat entries checked, none missing")
    return report
