"""A step whose worker stood still between its claim and its start does not start.

Recovery counts a claimed attempt's time from the claim: once a heartbeat's TTL has passed
without a heartbeat, it runs the attempt again elsewhere. A worker frozen in between (the chaos
suite's SIGSTOP landed there; a claim held up by a database lock does the same) used to write its
first heartbeat on waking and start the step beside its replacement.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from sqlalchemy import select, text

from celeryapp import app as chordbeat_app
from celeryapp import outcome
from celeryapp.application import ChordbeatCelery
from celeryapp.interfaces import service
from celeryapp.messaging import keys
from celeryapp.messaging.redis_client import get_redis
from celeryapp.worker import runner
from celeryapp.worker.lease import lease_s
from celeryapp.worker.step_events import RunnerAnswer
from models import WorkerTask, get_engine, transaction
from tests.support.helpers import token_of_task
from tests.support.servers import wait_for

pytestmark = pytest.mark.both_databases

_RAN = "tests:frozen-start:ran"


@chordbeat_app.task(name="tests.frozen_start.mark")
def mark() -> dict[str, Any]:
    get_redis(chordbeat_app.settings.broker_url).incr(_RAN)
    return outcome.completed("ran")


def _queued_attempt(app: ChordbeatCelery, name: str) -> int:
    service.apply_schedule(app, {"name": name, "every": 3600, "steps": [{"name": "a", "task": mark.name}]})
    execution_id = service.trigger_schedule(app, name)["execution_id"]
    with transaction(app.settings.database_url) as session:
        return session.scalars(select(WorkerTask.id).where(WorkerTask.execution_id == execution_id)).one()


def _waiting_for_a_lock(app: ChordbeatCelery) -> bool:
    # A connection of its own: within a transaction, PostgreSQL's activity view is a snapshot.
    with get_engine(app.settings.database_url).connect() as conn:
        waiting = text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
        return bool(conn.execute(waiting).scalar())


def _run_with_claim_held_up(app: ChordbeatCelery, task_id: int, hold_s: float) -> dict[str, Any]:
    """Run the attempt while another transaction holds its row for ``hold_s``: the claim, sent at
    once, commits only after that."""
    answer: dict[str, Any] = {}
    with get_engine(app.settings.database_url).connect() as holder:
        holder.execute(text("SELECT id FROM worker_tasks WHERE id = :id FOR UPDATE"), {"id": task_id})
        thread = threading.Thread(target=lambda: answer.update(runner.run_step(app, task_id, 1, node="frozen")))
        thread.start()
        wait_for(lambda: _waiting_for_a_lock(app), 10, interval=0.02, what="the claim to wait for the lock")
        held_from = time.monotonic()
        while time.monotonic() - held_from < hold_s:
            time.sleep(0.05)  # the hold-up's length, not a synchronisation
        holder.rollback()
    thread.join(30)
    return answer


def test_a_step_whose_claim_outlasted_its_lease_is_not_started(app: ChordbeatCelery, database_url: str) -> None:
    if not database_url.startswith("postgresql"):
        pytest.skip("a claim waits on a row lock on PostgreSQL; SQLite's writers fail and retry")
    client = get_redis(app.settings.broker_url)
    client.delete(_RAN)
    late = _queued_attempt(app, "frozen-late")
    assert _run_with_claim_held_up(app, late, lease_s(app.settings.heartbeat_ttl_s) + 0.3) == {
        "status": RunnerAnswer.LEASE_LOST.value
    }
    # Not started: nothing ran, and no heartbeat hides the attempt from recovery.
    assert client.get(_RAN) is None
    assert not client.exists(keys.heartbeat_key(late, 1, token_of_task(app, late)))
    # The same hold-up shorter than the lease: the step runs (the test can tell the two apart).
    on_time = _queued_attempt(app, "frozen-on-time")
    assert _run_with_claim_held_up(app, on_time, 0.3) == {"status": "complete"}
    assert client.get(_RAN) == "1"
