"""A step attempt's claim and outcome: each a compare-and-set that whoever loses changes nothing.

On PostgreSQL each is one statement (the outcome committing by itself, ``autocommit``), on
SQLite two in a transaction; both run here on both databases, as the runner calls them.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

import pytest
from sqlalchemy import func, make_url, select, text, update

from celeryapp.application import ChordbeatCelery
from celeryapp.execution.runs import cancel_execution
from celeryapp.execution.steps import Claim, Recorded, claim_step, finish_step
from celeryapp.interfaces import service
from models import Activity, ActivityStatus, WorkerTask, WorkerTaskStatus, transaction, utcnow
from models.session import autocommit, connection
from tasks.control import advance_execution as advance_task
from tests.support.helpers import step


def _queued(app: ChordbeatCelery, name: str) -> tuple[int, int]:
    """A run of a one-step schedule recorded, its message never sent: (execution id, worker task id)."""
    service.apply_schedule(app, {"name": name, "every": 3600, "steps": [step("only", kwargs={"seconds": 0})]})
    execution_id = service.trigger_schedule(app, name)["execution_id"]
    with transaction(app.settings.database_url) as session:
        task_id = session.scalar(select(WorkerTask.id).where(WorkerTask.execution_id == execution_id))
    assert task_id is not None
    return execution_id, task_id


def _claim(app: ChordbeatCelery, task_id: int, attempt: int = 1, node: str = "w1@host") -> Claim | None:
    with connection(app.settings.database_url) as conn:
        return claim_step(conn, task_id, attempt, node=node, now=utcnow())


def _finish(app: ChordbeatCelery, claim: Claim, status: ActivityStatus = ActivityStatus.COMPLETE) -> Recorded:
    with autocommit(app.settings.database_url) as conn:
        return finish_step(conn, claim, status, now=utcnow(), message="done")


def _activities(app: ChordbeatCelery, execution_id: int) -> list[tuple[Any, ...]]:
    with transaction(app.settings.database_url) as session:
        rows = session.execute(
            select(Activity.attempt, Activity.status, Activity.worker, Activity.message)
            .where(Activity.execution_id == execution_id)
            .order_by(Activity.id)
        ).all()
    return [tuple(r) for r in rows]


def _task(app: ChordbeatCelery, task_id: int) -> tuple[Any, ...] | None:
    with transaction(app.settings.database_url) as session:
        row = session.execute(
            select(WorkerTask.status, WorkerTask.attempt, WorkerTask.node).where(WorkerTask.id == task_id)
        ).first()
    return None if row is None else tuple(row)


def test_a_claim_opens_one_activity_and_returns_the_step_as_planned(app: ChordbeatCelery) -> None:
    execution_id, task_id = _queued(app, "claimed")
    claim = _claim(app, task_id)
    assert claim is not None
    assert (claim.execution_id, claim.worker_task_id, claim.attempt, claim.step_index) == (execution_id, task_id, 1, 0)
    assert (claim.spec.name, claim.spec.task, claim.schedule_name) == ("only", "chordbeat.examples.sleep", "claimed")
    assert _task(app, task_id) == (WorkerTaskStatus.PROCESSING, 1, "w1@host")
    assert _activities(app, execution_id) == [(1, ActivityStatus.IN_PROGRESS, "w1@host", None)]
    # The same message again, or a stale attempt number: nothing claimed, nothing opened.
    assert _claim(app, task_id, node="w2@host") is None
    assert _claim(app, task_id, attempt=2) is None
    assert _task(app, task_id) == (WorkerTaskStatus.PROCESSING, 1, "w1@host")
    assert len(_activities(app, execution_id)) == 1


def test_an_attempt_of_a_run_that_ended_is_not_claimed(app: ChordbeatCelery) -> None:
    execution_id, task_id = _queued(app, "ended")
    with transaction(app.settings.database_url) as session:
        # Its worker tasks deleted with it: only the run's status can stop the claim, as a row
        # left behind by a crash between the two would.
        cancel_execution(session, execution_id, now=utcnow())
        session.execute(
            text(
                "INSERT INTO worker_tasks (id, execution_id, step_index, step_name, status, attempt) "
                "VALUES (:id, :e, 0, 'only', 'queued', 1)"
            ),
            {"id": task_id, "e": execution_id},
        )
    assert _task(app, task_id) == (WorkerTaskStatus.QUEUED, 1, None)
    assert _claim(app, task_id) is None
    assert _activities(app, execution_id) == []


def test_an_outcome_closes_the_activity_and_drops_the_task_once(app: ChordbeatCelery) -> None:
    execution_id, task_id = _queued(app, "finished")
    claim = _claim(app, task_id)
    assert claim is not None
    assert _finish(app, claim)[:2] == (True, True)  # closed, the group's last (with the group read, on PostgreSQL)
    assert _task(app, task_id) is None
    assert _activities(app, execution_id) == [(1, ActivityStatus.COMPLETE, "w1@host", "done")]
    # Recorded again (a retry after a lost answer): changes nothing, and says so.
    assert _finish(app, claim, ActivityStatus.FAILED_WITH_ERROR) == Recorded(closed=False, last_of_group=False)
    assert _activities(app, execution_id) == [(1, ActivityStatus.COMPLETE, "w1@host", "done")]


def test_the_outcome_of_an_attempt_recovery_gave_up_changes_nothing(app: ChordbeatCelery) -> None:
    execution_id, task_id = _queued(app, "fenced")
    claim = _claim(app, task_id)
    assert claim is not None
    # What recovery does to a lost attempt: its activity failed, the task queued as attempt 2.
    with transaction(app.settings.database_url) as session:
        session.execute(
            update(Activity).where(Activity.id == claim.activity_id).values(status=ActivityStatus.FAILED_WITH_ERROR)
        )
        session.execute(
            update(WorkerTask).where(WorkerTask.id == task_id).values(status=WorkerTaskStatus.QUEUED, attempt=2)
        )
    assert _finish(app, claim) == Recorded(closed=False, last_of_group=False)
    assert _task(app, task_id) == (WorkerTaskStatus.QUEUED, 2, "w1@host")
    assert _activities(app, execution_id) == [(1, ActivityStatus.FAILED_WITH_ERROR, "w1@host", None)]
    second = _claim(app, task_id, attempt=2, node="w2@host")
    assert second is not None and second.attempt == 2


def test_only_the_last_attempt_of_a_group_to_finish_is_told_so(app: ChordbeatCelery) -> None:
    steps = [[step("a", kwargs={"seconds": 0}), step("b", kwargs={"seconds": 0})], step("c", kwargs={"seconds": 0})]
    service.apply_schedule(app, {"name": "pair", "every": 3600, "steps": steps})
    execution_id = service.trigger_schedule(app, "pair")["execution_id"]
    with transaction(app.settings.database_url) as session:
        first, second = session.scalars(
            select(WorkerTask.id)
            .where(WorkerTask.execution_id == execution_id, WorkerTask.step_index == 0)
            .order_by(WorkerTask.id)
        )
    claims = [_claim(app, first), _claim(app, second)]
    assert claims[0] is not None and claims[1] is not None
    # The next group's waiting attempt is not the group's: it does not count.
    assert _finish(app, claims[1]) == Recorded(closed=True, last_of_group=False)
    assert _finish(app, claims[0])[:2] == (True, True)  # closed, the last (with the group read, on PostgreSQL)


def test_a_connection_used_in_autocommit_goes_back_to_the_pool_transactional(app: ChordbeatCelery) -> None:
    """Autocommit is for that one checkout: a transaction on the same pooled connection afterwards
    must still roll back as a whole (every compare-and-set of several statements depends on it)."""
    _, task_id = _queued(app, "pooled")
    url = app.settings.database_url
    with autocommit(url) as conn:
        conn.execute(text("SELECT 1"))
    with pytest.raises(RuntimeError), connection(url) as conn:
        conn.execute(update(WorkerTask).where(WorkerTask.id == task_id).values(node="half-written"))
        raise RuntimeError("fails after the first statement")
    assert _task(app, task_id) == (WorkerTaskStatus.QUEUED, 1, None)
    with transaction(url) as session:
        assert session.scalar(select(func.count()).select_from(WorkerTask)) == 1


def test_a_chord_body_finding_nothing_to_do_does_not_wait_for_sqlites_writer(app: ChordbeatCelery) -> None:
    """The body's look at the run is a read: on SQLite it must not queue for the write lock behind
    every step's outcome (PostgreSQL's readers never wait for writers)."""
    url = make_url(app.settings.database_url)
    if url.get_backend_name() != "sqlite":
        pytest.skip("PostgreSQL's readers never wait for writers")
    execution_id, _task_id = _queued(app, "past")
    assert url.database is not None
    writer = sqlite3.connect(url.database, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # another process's write in progress
    try:
        started = time.monotonic()
        advance_task(execution_id, 5)  # a group the run is not at: nothing to do
        assert time.monotonic() - started < 5
    finally:
        writer.execute("ROLLBACK")
        writer.close()
