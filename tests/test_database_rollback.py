"""A database that went back (a failover to an asynchronous standby lost its last commits) while
Redis kept what was written beside them: recovery sends nothing that still runs.

The rollback is made here by undoing, in the database, what the lost commits did (a claim, a
re-queue); the lab's promoted standby (test_standby_failover) loses them for real.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import delete, select, update

from celeryapp.application import ChordbeatCelery
from celeryapp.execution.steps import claim_step
from celeryapp.interfaces import service
from celeryapp.messaging import keys
from celeryapp.messaging.redis_client import get_redis
from celeryapp.recovery import recovery
from models import Activity, WorkerTask, WorkerTaskStatus, transaction, utcnow
from tests.helpers import step
from tests.test_recovery import backdate, recovery_has_been_running, start_without_dispatch


def _one_step_run(app: ChordbeatCelery, name: str) -> tuple[int, int]:
    service.apply_schedule(app, {"name": name, "every": 60, "steps": [step("a")]})
    execution_id = start_without_dispatch(app, name)
    with transaction(app.settings.database_url, read_only=True) as session:
        task_id = session.scalar(select(WorkerTask.id).where(WorkerTask.execution_id == execution_id))
    assert task_id is not None
    return execution_id, task_id


def _attempt(app: ChordbeatCelery, task_id: int) -> tuple[WorkerTaskStatus, int]:
    with transaction(app.settings.database_url, read_only=True) as session:
        task = session.get_one(WorkerTask, task_id)
        return task.status, task.attempt


def test_a_queued_attempt_whose_heartbeat_beats_is_not_sent_again_until_it_ends(app: ChordbeatCelery) -> None:
    """Its claim was lost with the database: a worker runs it. A second message would run the same
    attempt number beside it; once it ended, the attempt is sent again (its outcome was lost too)."""
    execution_id, task_id = _one_step_run(app, "lostclaim")
    with transaction(app.settings.database_url) as session:
        assert claim_step(session.connection(), task_id, 1, node="w@host", now=utcnow()) is not None
    heartbeat = keys.heartbeat_key(task_id, 1)
    redis_client = get_redis(app.settings.broker_url)
    redis_client.set(heartbeat, "1", px=60_000)  # the worker running the claimed attempt
    # The failover loses the claim's commit: queued again, no activity; the message was taken.
    with transaction(app.settings.database_url) as session:
        session.execute(
            update(WorkerTask)
            .where(WorkerTask.id == task_id)
            .values(status=WorkerTaskStatus.QUEUED, node=None, started_at=None)
        )
        session.execute(delete(Activity).where(Activity.execution_id == execution_id))
    backdate(app, execution_id)
    recovery_has_been_running(app)
    assert recovery.recover(app).resent == []
    assert not redis_client.exists(keys.dispatch_marker_key(task_id, 1))
    assert _attempt(app, task_id) == (WorkerTaskStatus.QUEUED, 1)
    redis_client.delete(heartbeat)  # the step ended; its outcome found no claim to record
    assert recovery.recover(app).resent == [task_id]
    assert redis_client.exists(keys.dispatch_marker_key(task_id, 1))


def test_a_lost_attempt_whose_next_attempt_runs_is_not_requeued_until_that_one_ends(app: ChordbeatCelery) -> None:
    """The database lost a re-queue (attempt 1 lost, attempt 2 claimed and running elsewhere):
    attempt 1, processing without a heartbeat, is not re-queued as a second attempt 2 while it runs."""
    execution_id, task_id = _one_step_run(app, "lostrequeue")
    with transaction(app.settings.database_url) as session:
        assert claim_step(session.connection(), task_id, 1, node="gone@host", now=utcnow()) is not None
    backdate(app, execution_id)
    redis_client = get_redis(app.settings.broker_url)
    second = keys.heartbeat_key(task_id, 2)
    redis_client.set(second, "1", px=60_000)
    recovery_has_been_running(app)
    assert recovery.recover(app).requeued == []
    assert _attempt(app, task_id) == (WorkerTaskStatus.PROCESSING, 1)
    redis_client.delete(second)
    assert recovery.recover(app, now=utcnow() + timedelta(seconds=1)).requeued == [task_id]
    assert _attempt(app, task_id) == (WorkerTaskStatus.QUEUED, 2)
