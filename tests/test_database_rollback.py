"""A database that went back (a failover to an asynchronous standby lost its last commits) while
Redis kept what was written beside them: recovery sends nothing that still runs.

The rollback is made here by undoing, in the database, what the lost commits did (a claim, a
re-queue); the lab's promoted standby (test_standby_failover) loses them for real.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import delete, select, text, update

from celeryapp import app as chordbeat_app
from celeryapp import outcome
from celeryapp.application import ChordbeatCelery
from celeryapp.context import current_step
from celeryapp.execution.runs import start_execution
from celeryapp.execution.steps import claim_step, finish_step
from celeryapp.interfaces import service
from celeryapp.messaging import keys
from celeryapp.messaging.redis_client import get_redis
from celeryapp.recovery import database_rollback, heartbeat_trust, recovery
from celeryapp.worker import heartbeat
from models import (
    Activity,
    ActivityStatus,
    Schedule,
    ScheduleExecution,
    Trigger,
    WorkerTask,
    WorkerTaskStatus,
    transaction,
    utcnow,
)
from tests.support.helpers import finished, running, step, token_of_task, wait_for

pytestmark = pytest.mark.both_databases


def _one_step_run(app: ChordbeatCelery, name: str) -> tuple[int, int]:
    """A run recorded in the database whose message was never sent (a crash after commit)."""
    service.apply_schedule(app, {"name": name, "every": 60, "overlap": "allow", "steps": [step("a")]})
    with transaction(app.settings.database_url) as session:
        schedule = session.scalars(select(Schedule).where(Schedule.name == name)).one()
        execution_id = start_execution(
            session, schedule, trigger=Trigger.MANUAL, run_key=f"{name}:unsent", now=utcnow()
        ).execution_id
        assert execution_id is not None
        task_id = session.scalars(select(WorkerTask.id).where(WorkerTask.execution_id == execution_id)).one()
    return execution_id, task_id


def backdate(app: ChordbeatCelery, execution_id: int) -> None:
    """As if the run's attempt had been queued (or claimed) a minute ago."""
    past = utcnow() - timedelta(seconds=60)
    with transaction(app.settings.database_url) as session:
        session.execute(
            update(WorkerTask).where(WorkerTask.execution_id == execution_id).values(queued_at=past, started_at=past)
        )


def recovery_has_been_running(app: ChordbeatCelery) -> None:
    """As if the periodic recovery had been running all along (no gap, so heartbeats count)."""
    client = get_redis(app.settings.broker_url)
    client.set(heartbeat_trust.RECOVERY_SEEN_KEY, "1", ex=60)
    client.delete(heartbeat_trust.HEARTBEAT_GRACE_KEY)


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
    token = token_of_task(app, task_id)
    heartbeat = keys.heartbeat_key(task_id, 1, token)
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
    assert not redis_client.exists(keys.dispatch_marker_key(task_id, 1, token))
    assert _attempt(app, task_id) == (WorkerTaskStatus.QUEUED, 1)
    redis_client.delete(heartbeat)  # the step ended; its outcome found no claim to record
    assert recovery.recover(app).resent == [task_id]
    assert redis_client.exists(keys.dispatch_marker_key(task_id, 1, token))


def test_a_lost_attempt_whose_next_attempt_runs_is_not_requeued_until_that_one_ends(app: ChordbeatCelery) -> None:
    """The database lost a re-queue (attempt 1 lost, attempt 2 claimed and running elsewhere):
    attempt 1, processing without a heartbeat, is not re-queued as a second attempt 2 while it runs."""
    execution_id, task_id = _one_step_run(app, "lostrequeue")
    with transaction(app.settings.database_url) as session:
        assert claim_step(session.connection(), task_id, 1, node="gone@host", now=utcnow()) is not None
    backdate(app, execution_id)
    redis_client = get_redis(app.settings.broker_url)
    second = keys.heartbeat_key(task_id, 2, token_of_task(app, task_id))
    redis_client.set(second, "1", px=60_000)
    recovery_has_been_running(app)
    assert recovery.recover(app).requeued == []
    assert _attempt(app, task_id) == (WorkerTaskStatus.PROCESSING, 1)
    redis_client.delete(second)
    assert recovery.recover(app, now=utcnow() + timedelta(seconds=1)).requeued == [task_id]
    assert _attempt(app, task_id) == (WorkerTaskStatus.QUEUED, 2)


def _sequence_back_to(app: ChordbeatCelery, table: str, last_id: int) -> None:
    """What the promoted standby's sequence says: the ids after ``last_id`` were never handed out."""
    with transaction(app.settings.database_url) as session:
        if session.bind is not None and session.bind.dialect.name == "postgresql":
            session.execute(
                text("SELECT setval(pg_get_serial_sequence(:t, 'id'), :v, :called)"),
                {"t": table, "v": max(last_id, 1), "called": last_id > 0},
            )
        else:
            session.execute(text("UPDATE sqlite_sequence SET seq = :v WHERE name = :t"), {"t": table, "v": last_id})


def test_a_database_behind_the_ids_redis_saw_is_detected_its_sequences_moved_and_repairs_paused(
    app: ChordbeatCelery, caplog: pytest.LogCaptureFixture
) -> None:
    """A run started and sent on the old primary is lost with the failover; only its dispatch (in
    Redis) remembers its ids. The next pass says so, moves the sequences past them and repairs
    nothing for a heartbeat TTL (a message lost meanwhile is sent after)."""
    kept, kept_task = _one_step_run(app, "kept")  # its message lost: a repair to make
    backdate(app, kept)
    lost = service.trigger_schedule(app, "kept")["execution_id"]
    with transaction(app.settings.database_url) as session:
        lost_tasks = session.scalars(select(WorkerTask.id).where(WorkerTask.execution_id == lost)).all()
        session.execute(delete(ScheduleExecution).where(ScheduleExecution.id == lost))
    _sequence_back_to(app, "schedule_executions", kept)
    _sequence_back_to(app, "worker_tasks", kept_task)
    recovery_has_been_running(app)
    with caplog.at_level(logging.CRITICAL, logger=database_rollback.__name__):
        report = recovery.recover(app)
    assert report.repairs_paused and report.resent == []
    assert f"schedule_executions: database at {kept}, seen {lost}" in caplog.text
    assert f"worker_tasks: database at {kept_task}, seen {max(lost_tasks)}" in caplog.text
    again = service.trigger_schedule(app, "kept")["execution_id"]
    assert again > lost + database_rollback.SEQUENCE_MARGIN
    caplog.clear()
    wait_for(lambda: recovery.recover(app).resent == [kept_task], 10, interval=0.2, what="the pause to end")
    assert "went back" not in caplog.text


def _lose(app: ChordbeatCelery, execution_id: int) -> None:
    """What a failover to an asynchronous standby does to a run committed just before it: its rows
    were never there, and the sequences hand out its ids again."""
    with transaction(app.settings.database_url) as session:
        task_ids = session.scalars(select(WorkerTask.id).where(WorkerTask.execution_id == execution_id)).all()
        activity_ids = session.scalars(select(Activity.id).where(Activity.execution_id == execution_id)).all()
        session.execute(delete(Activity).where(Activity.execution_id == execution_id))
        session.execute(delete(WorkerTask).where(WorkerTask.execution_id == execution_id))
        session.execute(delete(ScheduleExecution).where(ScheduleExecution.id == execution_id))
    _sequence_back_to(app, "schedule_executions", execution_id - 1)
    if task_ids:
        _sequence_back_to(app, "worker_tasks", min(task_ids) - 1)
    if activity_ids:
        _sequence_back_to(app, "activities", min(activity_ids) - 1)


def test_a_run_given_the_id_of_a_run_lost_with_the_database_meets_none_of_its_redis_state(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    """The lost run was cancelled: its cancel flag and its runner's revoked task id outlive it in
    Redis and in the worker. The run that gets its id runs to its end (it was stopped at once)."""
    service.apply_schedule(
        app, {"name": "reused", "every": 60, "overlap": "allow", "steps": [step("a", kwargs={"seconds": 1.5})]}
    )
    lost = service.trigger_schedule(app, "reused")["execution_id"]
    running(client, lost, "a")
    service.cancel_execution(app, lost)
    assert finished(client, lost)["status"] == "cancelled"
    _lose(app, lost)
    again = service.trigger_schedule(app, "reused")["execution_id"]
    assert again == lost
    done = finished(client, again)
    assert (done["status"], [a["status"] for a in done["activities"]]) == ("completed", ["complete"])


def test_an_outcome_whose_claim_was_lost_closes_no_other_runs_activity(app: ChordbeatCelery) -> None:
    """The lost claim's activity id is handed out again, to another run's claim: the first
    runner's outcome must not close it (nor count as the attempt's)."""
    _first, first_task = _one_step_run(app, "first")
    with transaction(app.settings.database_url) as session:
        lost_claim = claim_step(session.connection(), first_task, 1, node="w@host", now=utcnow())
    assert lost_claim is not None
    with transaction(app.settings.database_url) as session:
        session.execute(delete(Activity).where(Activity.id == lost_claim.activity_id))
        session.execute(
            update(WorkerTask)
            .where(WorkerTask.id == first_task)
            .values(status=WorkerTaskStatus.QUEUED, node=None, started_at=None)
        )
    _sequence_back_to(app, "activities", lost_claim.activity_id - 1)
    _second, second_task = _one_step_run(app, "second")
    with transaction(app.settings.database_url) as session:
        other = claim_step(session.connection(), second_task, 1, node="v@host", now=utcnow())
    assert other is not None and other.activity_id == lost_claim.activity_id
    with transaction(app.settings.database_url) as session:
        recorded = finish_step(session.connection(), lost_claim, ActivityStatus.COMPLETE, now=utcnow())
    assert not recorded.closed and not recorded.last_of_group
    with transaction(app.settings.database_url, read_only=True) as session:
        assert session.get_one(Activity, other.activity_id).status is ActivityStatus.IN_PROGRESS
        assert session.get_one(WorkerTask, first_task).status is WorkerTaskStatus.QUEUED


def test_a_claim_of_an_attempt_that_runs_elsewhere_is_undone_and_runs_nothing(
    app: ChordbeatCelery, worker: Any
) -> None:
    """A message of an attempt whose claim the database lost (its runner still at work) is sent
    by something other than recovery (an advancement, a duplicate): its claim succeeds, but the
    first heartbeat finds the other runner's. Nothing runs; the claim is undone for recovery."""
    execution_id, task_id = _one_step_run(app, "twice")
    token = token_of_task(app, task_id)
    redis_client = get_redis(app.settings.broker_url)
    other = keys.heartbeat_key(task_id, 1, token)
    redis_client.set(other, "1", px=60_000)
    answer = app.send_task("chordbeat.run_step", args=(task_id, 1, token), ignore_result=False).get(timeout=20)
    assert answer == {"status": "skipped"}
    assert _attempt(app, task_id) == (WorkerTaskStatus.QUEUED, 1)
    with transaction(app.settings.database_url, read_only=True) as session:
        assert session.scalars(select(Activity).where(Activity.execution_id == execution_id)).all() == []
    wait_for(lambda: not heartbeat._watchers, 10, interval=0.05, what="the step watch to end")
    assert redis_client.exists(other)  # the other runner's: not deleted with the watch that found it
    redis_client.delete(other)


@chordbeat_app.task(name="tests.report_run_token")
def report_run_token() -> dict[str, Any]:
    context = current_step()
    assert context is not None
    return outcome.completed(f"{context.execution_id}/{context.run_token}")


def test_a_step_is_told_its_runs_token_to_fence_external_writes_by(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    """An id alone no longer names a run once a database went back: a step passing its attempt to
    an external system as a fencing token names the run by its id and token."""
    fencing = {"name": "s", "task": "tests.report_run_token"}
    service.apply_schedule(app, {"name": "fencing", "every": 60, "steps": [fencing]})
    execution_id = service.trigger_schedule(app, "fencing")["execution_id"]
    done = finished(client, execution_id)
    with transaction(app.settings.database_url, read_only=True) as session:
        token = session.get_one(ScheduleExecution, execution_id).token
    assert token > 0 and done["activities"][0]["message"] == f"{execution_id}/{token}"
