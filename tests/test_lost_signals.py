"""Signals that outlive a failed write: a cancel commits in the database, then sets its flag in
Redis. When that write fails (Redis away at that very moment), the run's running step is stopped
all the same, by its own question to the database (celeryapp/worker/attempt_check.py), and the
two runs of a ``cancel_previous`` schedule do not overlap past one recovery interval. An
operator's stop, which is only a flag, is written once Redis answers."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import select
from sqlalchemy.orm import Session

import tests.support.fault_tasks  # noqa: F401  (registers the fault step tasks in this process too)
from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.errors import StepCancelled
from celeryapp.execution.runs import cancel_execution
from celeryapp.execution.steps import claim_step
from celeryapp.interfaces import service
from celeryapp.messaging import keys
from celeryapp.messaging.redis_client import get_redis
from celeryapp.recovery import recovery
from celeryapp.recovery.repair import requeue_attempt
from celeryapp.worker.attempt_check import asking_the_database
from celeryapp.worker.heartbeat import Interrupt, StepWatch
from celeryapp.worker.step_events import STOP_FLAG_TTL_S, TERMINATED, stop_attempt
from models import ExecutionStatus, ScheduleExecution, WorkerTask, transaction, utcnow
from models.session import connection
from tests.support import processes
from tests.support.fault_tasks import read_log
from tests.support.helpers import step, wait_for
from tests.support.servers import RedisServer

pytestmark = [pytest.mark.slow, pytest.mark.both_databases]

#: The worker's recovery interval, which is how often a long step asks the database.
INTERVAL_S = 2.0
#: Well past the moment Redis is away: the step's lease (the heartbeat's TTL less 0.75 s) must not
#: run out meanwhile, or the step would stop for that reason and the test would prove nothing.
HEARTBEAT_TTL_S = 15.0


def _events(log: Path, execution_id: int, event: str) -> list[dict[str, Any]]:
    return [e for e in read_log(str(log)) if e["execution_id"] == execution_id and e["event"] == event]


def _started(log: Path, execution_id: int) -> float:
    (start,) = wait_for(lambda: _events(log, execution_id, "start"), 30, what=f"execution {execution_id}'s step")
    wait_for(lambda: _events(log, execution_id, "tick"), 10, what=f"execution {execution_id}'s step to tick")
    return float(start["t"])


def _stopped(log: Path, execution_id: int) -> float:
    """When the step was interrupted (it ticks for a minute otherwise, and logs its end)."""
    (event,) = wait_for(
        lambda: _events(log, execution_id, "interrupted"), 30, interval=0.1, what=f"execution {execution_id}'s stop"
    )
    assert not _events(log, execution_id, "end")
    return float(event["t"])


def _status(app: ChordbeatCelery, execution_id: int) -> ExecutionStatus:
    with transaction(app.settings.database_url, read_only=True) as session:
        return session.get_one(ScheduleExecution, execution_id).status


@pytest.mark.timeout(120)
def test_a_cancel_whose_flag_write_failed_still_stops_its_step(
    app: ChordbeatCelery, settings: Settings, tmp_path: Path, redis_server: RedisServer
) -> None:
    log = tmp_path / "steps.log"
    tick = {"name": "long", "task": "faults.tick", "kwargs": {"log": str(log), "seconds": 60}}
    worker_settings = dataclasses.replace(settings, recovery_interval_s=INTERVAL_S, heartbeat_ttl_s=HEARTBEAT_TTL_S)
    with processes.worker(worker_settings, tmp_path, "w1", env=processes.FAULT_TASKS_ENV):
        service.apply_schedule(app, {"name": "cut", "every": 3600, "overlap": "cancel_previous", "steps": [tick]})

        # A cancel: it commits, then its flag's write fails (Redis is away that moment).
        first = service.trigger_schedule(app, "cut")["execution_id"]
        _started(log, first)
        redis_server.stop()
        with pytest.raises(redis.RedisError):
            service.cancel_execution(app, first)
        cancelled_at = time.time()
        redis_server.start()
        assert _status(app, first) is ExecutionStatus.CANCELLED
        took = _stopped(log, first) - cancelled_at

        # cancel_previous: the new run's start cancels the old one in the same commit; the flag's
        # write fails, and so does the new run's publish (recovery sends it).
        second = service.trigger_schedule(app, "cut")["execution_id"]
        _started(log, second)
        redis_server.stop()
        with pytest.raises(redis.RedisError):
            service.trigger_schedule(app, "cut")
        replaced_at = time.time()
        redis_server.start()
        with transaction(app.settings.database_url, read_only=True) as session:
            third = session.scalar(select(ScheduleExecution.id).where(ScheduleExecution.id > second))
        assert third is not None and _status(app, second) is ExecutionStatus.CANCELLED
        wait_for(
            lambda: _events(log, third, "start") or (recovery.recover(app) and None),
            30,
            interval=0.5,
            what="recovery to send the new run's step",
        )
        new_started = _started(log, third)
        old_stopped = _stopped(log, second)
    overlap = old_stopped - new_started
    print(
        f"\ncancel without its flag: step stopped {took:.1f}s after; cancel_previous: {old_stopped - replaced_at:.1f}s "
        f"after, overlap {overlap:.1f}s"
    )
    assert overlap <= INTERVAL_S, f"the two runs of the exclusive schedule overlapped {overlap:.1f}s"


def test_an_operators_stop_whose_write_failed_is_written_once_redis_answers(
    app: ChordbeatCelery, redis_server: RedisServer
) -> None:
    """Flower's Terminate or Revoke reached the worker, whose write of the stop flag then failed:
    the worker tries again until Redis answers, and the step's watch finds the flag then."""
    redis_server.stop()
    try:
        assert stop_attempt(app, ("41", "2", "7"), TERMINATED) is False
    finally:
        redis_server.start()
    client = get_redis(app.settings.broker_url)
    wait_for(lambda: client.exists(keys.stop_key(41, 2, 7)), 10, interval=0.1, what="the stop flag")
    assert 0 < client.ttl(keys.stop_key(41, 2, 7)) <= STOP_FLAG_TTL_S


def _claimed_watch(app: ChordbeatCelery, worker_task_id: int, attempt: int) -> StepWatch:
    """The attempt claimed, and a watch for its step (made in this thread: the one it interrupts)
    whose Redis flags nobody sets: only the database's answer can stop the step."""
    url = app.settings.database_url
    with connection(url) as conn:
        assert claim_step(conn, worker_task_id, attempt, node="test", now=utcnow()) is not None
    client = get_redis(app.settings.broker_url)
    return StepWatch(client, heartbeat_key="tests:hb", cancel_key="tests:never-set", ttl_s=30)


def test_the_database_alone_stops_a_fenced_or_cancelled_attempt(app: ChordbeatCelery) -> None:
    """Recovery gave the attempt up, then the run was cancelled, each committed without its flag
    (their effects never applied): the step's question to the database stops it, as fenced then as
    cancelled."""
    url = app.settings.database_url
    service.apply_schedule(app, {"name": "asked", "every": 3600, "steps": [step("a")]})
    execution_id = service.trigger_schedule(app, "asked")["execution_id"]
    with transaction(url, read_only=True) as session:
        task_id = session.scalars(select(WorkerTask.id).where(WorkerTask.execution_id == execution_id)).one()

    def given_up(session: Session) -> None:
        requeue_attempt(session, task_id, 1, reason="worker lost: the test", now=utcnow())

    def cancelled(session: Session) -> None:
        cancel_execution(session, execution_id, now=utcnow())

    for attempt, change, interrupt in ((1, given_up, Interrupt.FENCED), (2, cancelled, Interrupt.CANCELLED)):
        watch = _claimed_watch(app, task_id, attempt)
        with transaction(url) as session:
            change(session)
        stopped = False
        try:
            with (
                watch,
                asking_the_database(watch, database_url=url, worker_task_id=task_id, attempt=attempt, every_s=0.2),
            ):
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline:
                    time.sleep(0.01)  # a step at work
        except StepCancelled:
            stopped = True
        assert stopped and watch.interrupted is interrupt
