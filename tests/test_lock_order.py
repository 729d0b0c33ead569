"""One lock order on PostgreSQL (schedule, execution, worker task, activity), READ COMMITTED
pinned, and the transactions the database aborts anyway (deadlocks, serialization failures) run
again.

The interleavings are forced, not hoped for: a transaction is held still just before one of its
statements (an engine event in its thread) while the other runs up to its lock wait, seen in
``pg_stat_activity``. With locks taken in two orders, that is a deadlock every time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import requests
from sqlalchemy import Engine, create_engine, event, select, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import NullPool

from celeryapp.application import ChordbeatCelery
from celeryapp.execution.runs import cancel_execution
from celeryapp.execution.steps import Claim, Recorded, claim_step, finish_step
from celeryapp.interfaces import service
from celeryapp.recovery.repair import requeue_attempt
from models import (
    Activity,
    ActivityStatus,
    ExecutionStatus,
    ScheduleExecution,
    WorkerTask,
    get_engine,
    transaction,
    utcnow,
)
from models.session import CONFLICT_TRIES, autocommit, connection, dispose_all, retrying
from tests.support.helpers import step, wait_for
from tests.support.web_server import ADMIN, WebServer, xsrf

pytestmark = pytest.mark.both_databases

POSTGRES_ONLY = pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)


class Side(threading.Thread):
    """One side of a race, in its own thread: what it returned or raised."""

    def __init__(self, name: str, work: Callable[[], Any]) -> None:
        super().__init__(name=name, daemon=True)
        self.work = work
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.work()
        except BaseException as exc:  # reported by the test
            self.error = exc

    def outcome(self) -> Any:
        self.join(60)
        assert not self.is_alive(), f"{self.name} still running"
        if self.error is not None:
            raise AssertionError(f"{self.name} failed: {self.error!r}") from self.error
        return self.result


@contextmanager
def held_before(url: str, thread: str, statement: str) -> Iterator[tuple[threading.Event, threading.Event]]:
    """Hold thread ``thread`` just before it sends the first statement starting with ``statement``
    (its transaction keeps every lock it took so far): (reached, go on)."""
    reached, go_on = threading.Event(), threading.Event()

    def hold(_conn: Any, _cursor: Any, sql: str, *_: Any) -> None:
        if threading.current_thread().name == thread and sql.lstrip().startswith(statement) and not reached.is_set():
            reached.set()
            go_on.wait(30)

    engine = get_engine(url)
    event.listen(engine, "before_cursor_execute", hold)
    try:
        yield reached, go_on
    finally:
        go_on.set()
        event.remove(engine, "before_cursor_execute", hold)


@pytest.fixture
def monitor(app: ChordbeatCelery) -> Iterator[Engine]:
    """A connection of the test's own, outside chordbeat's engines."""
    engine = create_engine(app.settings.database_url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    yield engine
    engine.dispose()


def lock_waits(monitor: Engine) -> int:
    with monitor.connect() as conn:
        return int(
            conn.scalar(
                text(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            )
        )


def race(monitor: Engine, url: str, first: Side, before: str, second: Side) -> tuple[Any, Any]:
    """Run ``first`` up to its statement starting with ``before`` and hold it there, run ``second``
    until it waits for a lock, let ``first`` go on: what each returned (either failing fails the test)."""
    with held_before(url, first.name, before) as (reached, go_on):
        first.start()
        assert reached.wait(20)
        second.start()
        wait_for(lambda: lock_waits(monitor) == 1, 20, what=f"{second.name} to wait for a lock")
        go_on.set()
        return first.outcome(), second.outcome()


def queued_run(app: ChordbeatCelery, name: str, **step_fields: Any) -> tuple[int, int]:
    """A run of a one-step schedule (``overlap: skip``), its message never consumed: (execution, worker task)."""
    service.apply_schedule(app, {"name": name, "every": 3600, "steps": [step("only", **step_fields)]})
    execution_id = service.trigger_schedule(app, name)["execution_id"]
    with transaction(app.settings.database_url) as session:
        task_id = session.scalar(select(WorkerTask.id).where(WorkerTask.execution_id == execution_id))
    assert task_id is not None
    return execution_id, task_id


def claim(app: ChordbeatCelery, task_id: int) -> Claim | None:
    with connection(app.settings.database_url) as conn:
        return claim_step(conn, task_id, 1, node="w1@host", now=utcnow())


def record(app: ChordbeatCelery, claimed: Claim) -> Recorded:
    with autocommit(app.settings.database_url) as conn:
        return finish_step(conn, claimed, ActivityStatus.COMPLETE, now=utcnow(), message="done")


def cancel(app: ChordbeatCelery, execution_id: int) -> None:
    with transaction(app.settings.database_url) as session:
        cancel_execution(session, execution_id, now=utcnow())


def state(app: ChordbeatCelery, execution_id: int) -> tuple[ExecutionStatus, list[ActivityStatus], int]:
    """The run's status, its activities' and how many worker tasks it has left."""
    with transaction(app.settings.database_url, read_only=True) as session:
        run = session.get_one(ScheduleExecution, execution_id)
        activities = list(session.scalars(select(Activity.status).where(Activity.execution_id == execution_id)))
        tasks = len(session.scalars(select(WorkerTask.id).where(WorkerTask.execution_id == execution_id)).all())
    return run.status, activities, tasks


@POSTGRES_ONLY
def test_a_cancel_and_an_outcome_at_once_both_complete(app: ChordbeatCelery, monitor: Engine) -> None:
    execution_id, task_id = queued_run(app, "cancel-vs-outcome")
    claimed = claim(app, task_id)
    assert claimed is not None
    # The cancel holds its lock on the worker task (deleted) and is about to close the activities.
    cancelling = Side("cancel", lambda: cancel(app, execution_id))
    outcome = Side("outcome", lambda: record(app, claimed))
    _, recorded = race(monitor, app.settings.database_url, cancelling, "UPDATE activities", outcome)
    # The cancel took the task first: the outcome finds nothing left to record.
    assert recorded == Recorded(closed=False, last_of_group=False)
    assert state(app, execution_id) == (ExecutionStatus.CANCELLED, [ActivityStatus.CANCELLED], 0)


@POSTGRES_ONLY
def test_a_claim_while_its_run_is_cancelled_both_complete(app: ChordbeatCelery, monitor: Engine) -> None:
    execution_id, task_id = queued_run(app, "cancel-vs-claim")
    # The cancel holds the run (its exclusive key cleared: a key update) and is about to delete its tasks.
    cancelling = Side("cancel", lambda: cancel(app, execution_id))
    claiming = Side("claim", lambda: claim(app, task_id))
    _, claimed = race(monitor, app.settings.database_url, cancelling, "DELETE FROM worker_tasks", claiming)
    assert claimed is None  # a cancelled run's step is not claimed
    assert state(app, execution_id) == (ExecutionStatus.CANCELLED, [], 0)


@POSTGRES_ONLY
def test_recovery_failing_a_lost_step_and_a_cancel_at_once_both_complete(app: ChordbeatCelery, monitor: Engine) -> None:
    execution_id, task_id = queued_run(app, "fail-vs-cancel", max_attempts=1)
    assert claim(app, task_id) is not None
    url = app.settings.database_url

    def fail_lost_step() -> None:
        with transaction(url) as session:
            requeue_attempt(session, task_id, 1, reason="worker lost: test", now=utcnow())

    # Out of attempts: recovery fails the step, which fails the run; held before it deletes the task.
    failing = Side("recovery", fail_lost_step)
    race(monitor, url, failing, "DELETE FROM worker_tasks", Side("cancel", lambda: cancel(app, execution_id)))
    # Recovery had the run first: it failed it; the cancel then found it ended.
    assert state(app, execution_id) == (ExecutionStatus.FAILED, [ActivityStatus.FAILED_WITH_ERROR], 0)


def _raise_sqlstate(url: str, sqlstate: str) -> None:
    """A real error of that SQLSTATE from the server, through our transaction and the driver."""
    with transaction(url) as session:
        session.execute(text(f"DO $$ BEGIN RAISE EXCEPTION 'test' USING ERRCODE = '{sqlstate}'; END $$"))


@POSTGRES_ONLY
@pytest.mark.parametrize("sqlstate", ["40P01", "40001"])
def test_deadlocks_and_serialization_failures_are_run_again_up_to_a_bound(
    app: ChordbeatCelery, sqlstate: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = app.settings.database_url
    tries: list[int] = []

    def fails_twice() -> str:
        tries.append(1)
        if len(tries) <= 2:
            _raise_sqlstate(url, sqlstate)
        with transaction(url) as session:
            return str(session.scalar(text("SELECT 'done'")))

    assert retrying("the test's work", fails_twice) == "done"
    assert len(tries) == 3
    assert sum("the test's work: aborted by the database" in r.getMessage() for r in caplog.records) == 2

    tries.clear()
    with pytest.raises(OperationalError) as raised:
        retrying("the test's work", lambda: tries.append(1) or _raise_sqlstate(url, sqlstate))
    assert len(tries) == CONFLICT_TRIES
    assert getattr(raised.value.orig, "sqlstate", None) == sqlstate


@POSTGRES_ONLY
@pytest.mark.parametrize("sqlstate", ["23505", "57014", "40003"])
def test_other_database_errors_are_not_run_again(app: ChordbeatCelery, sqlstate: str) -> None:
    tries: list[int] = []
    with pytest.raises(Exception) as raised:
        retrying("the test's work", lambda: tries.append(1) or _raise_sqlstate(app.settings.database_url, sqlstate))
    assert len(tries) == 1
    assert getattr(getattr(raised.value, "orig", None), "sqlstate", None) == sqlstate
    with pytest.raises(ValueError):
        retrying("the test's work", lambda: tries.append(1) or int("x"))
    assert len(tries) == 2


@POSTGRES_ONLY
def test_a_dashboard_cancel_aborted_by_a_deadlock_answers_cancelled(app: ChordbeatCelery, monitor: Engine) -> None:
    execution_id, task_id = queued_run(app, "dashboard-deadlock")
    claimed = claim(app, task_id)
    assert claimed is not None
    url = app.settings.database_url
    # Someone else takes the activity, then the task: the wrong order, a deadlock with the cancel
    # (task, then activities). The cancel is made its victim: it checks for a deadlock after 3 s
    # of waiting, the other after an hour.
    with monitor.connect() as conn:
        conn.execute(text(f"ALTER DATABASE {conn.engine.url.database} SET deadlock_timeout = '3s'"))
    dispose_all()
    other = create_engine(url, poolclass=NullPool)
    with WebServer(app) as web, other.connect() as conn:
        conn.execute(text("SET deadlock_timeout = '1h'"))
        conn.execute(text("SET lock_timeout = '30s'"))  # a lost race fails this test, not hang it
        conn.execute(select(Activity.id).where(Activity.id == claimed.activity_id).with_for_update())
        browser = web.session(ADMIN)
        post = Side(
            "browser",
            lambda: browser.post(
                f"{web.url}/act/cancel/{execution_id}",
                data={"_xsrf": xsrf(browser), "next": "/", "reason": "deadlock test"},
                allow_redirects=False,
                timeout=60,
            ),
        )
        post.start()
        wait_for(lambda: lock_waits(monitor) == 1, 20, what="the cancel to wait for the activity")
        conn.execute(select(WorkerTask.id).where(WorkerTask.id == task_id).with_for_update())
        conn.commit()
        answer: requests.Response = post.outcome()
    other.dispose()
    assert answer.status_code == 302, answer.text
    assert state(app, execution_id) == (ExecutionStatus.CANCELLED, [ActivityStatus.CANCELLED], 0)


@POSTGRES_ONLY
def test_read_committed_is_pinned_whatever_the_database_default(app: ChordbeatCelery, monitor: Engine) -> None:
    with monitor.connect() as conn:
        conn.execute(
            text(f"ALTER DATABASE {conn.engine.url.database} SET default_transaction_isolation = 'repeatable read'")
        )
    dispose_all()  # new connections see the database's new default
    url = app.settings.database_url
    show = text("SHOW transaction_isolation")
    with transaction(url) as session:
        assert session.scalar(show) == "read committed"
    with transaction(url, read_only=True) as session:
        assert session.scalar(show) == "read committed"
    with connection(url) as conn:
        assert conn.scalar(show) == "read committed"
    for read_only in (False, True):
        with autocommit(url, read_only=read_only) as conn:
            assert conn.scalar(show) == "read committed"
    with monitor.connect() as conn:  # the test's own connection has the default it was given
        assert conn.scalar(show) == "repeatable read"
