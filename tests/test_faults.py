"""Faults around a running step: a frozen worker, a database that fails the claim, a worker killed
while its claim or its outcome waits, a step that unwinds slowly after its timeout, a step calling ``sys.exit``,
and one corrupt row in a recovery pass."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import create_engine, select, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

import tests.support.fault_tasks  # noqa: F401  (registers the fault step tasks in the in-process worker)
from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.recovery import recovery
from celeryapp.worker.dispatch import apply_effects
from models import Activity, ScheduleExecution, transaction, utcnow
from models.session import PG_CONNECT_TIMEOUT_S, connection, get_engine
from tests.support import processes
from tests.support.fault_tasks import read_log
from tests.support.helpers import call, db_execution, finished, start_and_hold, step, wait_for
from tests.support.servers import PostgresServer

pytestmark = pytest.mark.both_databases


def tick(log: Path, seconds: float, **extra: Any) -> dict[str, Any]:
    unwind = extra.pop("unwind_s", 0.0)
    return {
        "name": "long",
        "task": "faults.tick",
        "kwargs": {"log": str(log), "seconds": seconds, "unwind_s": unwind},
        **extra,
    }


def activities(app: ChordbeatCelery, execution_id: int) -> list[Activity]:
    with transaction(app.settings.database_url, read_only=True) as session:
        rows = session.scalars(select(Activity).where(Activity.execution_id == execution_id).order_by(Activity.id))
        return list(rows)


def final(app: ChordbeatCelery, execution_id: int, timeout: float = 60) -> dict[str, Any]:
    done = wait_for(
        lambda: (e := db_execution(app, execution_id))["status"] != "in_progress" and e,
        timeout,
        interval=0.2,
        what=f"execution {execution_id} to end",
    )
    assert isinstance(done, dict)
    return done


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_frozen_worker_is_fenced_and_its_attempt_stops_when_it_wakes(
    app: ChordbeatCelery, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    log = tmp_path / "steps.log"
    env = processes.FAULT_TASKS_ENV
    # One slot: while it runs the step, the frozen worker holds no other message.
    with processes.worker(settings, tmp_path, "w1", concurrency=1, env=env) as w1, processes.beat(settings, tmp_path):
        call(client, "chordbeat.apply_schedule", definition={"name": "frozen", "every": 3600, "steps": [tick(log, 15)]})
        execution_id = call(client, "chordbeat.trigger_schedule", name="frozen")["execution_id"]
        wait_for(lambda: any(e["event"] == "tick" for e in read_log(str(log))), 30, what="the step to run")
        os.killpg(w1.pid, signal.SIGSTOP)  # a VM pause, longer than the heartbeat's TTL
        try:
            with processes.worker(settings, tmp_path, "w2", env=env):
                wait_for(
                    lambda: any(e["event"] == "tick" and e["attempt"] == 2 for e in read_log(str(log))),
                    60,
                    what="recovery to run attempt 2 elsewhere",
                )
                os.killpg(w1.pid, signal.SIGCONT)
                woke = time.time()
                done = final(app, execution_id)
        finally:
            os.killpg(w1.pid, signal.SIGCONT)
    events = read_log(str(log))
    first = [e for e in events if e["attempt"] == 1]
    assert any(e["event"] == "interrupted" for e in first), "the fenced attempt was not stopped"
    assert not any(e["event"] == "end" for e in first), "the fenced attempt ran to its end"
    last_tick = max(e["t"] for e in first if e["event"] == "tick")
    assert last_tick < woke + 3, f"attempt 1 went on ticking {last_tick - woke:.1f}s after waking"
    assert done["status"] == "completed", done
    one, two = done["activities"]
    assert (one["attempt"], one["status"]) == (1, "failed_with_error") and one["error"].startswith("worker lost")
    assert (two["attempt"], two["status"]) == (2, "complete")
    print(f"\nfrozen attempt stopped {last_tick - woke:.2f}s after its worker woke")


@contextlib.contextmanager
def claims_blocked(database_url: str) -> Iterator[None]:
    """Another session holds a lock that makes every claim wait (SQLite busy, PostgreSQL lock)."""
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite":
        assert url.database is not None
        connection = sqlite3.connect(url.database, isolation_level=None, timeout=30)
        connection.execute("BEGIN EXCLUSIVE")
        try:
            yield
        finally:
            connection.execute("ROLLBACK")
            connection.close()
        return
    engine = create_engine(database_url)
    with engine.connect() as connection:
        connection.execute(text("LOCK TABLE worker_tasks IN EXCLUSIVE MODE"))
        try:
            yield
        finally:
            connection.rollback()
    engine.dispose()


def active_on(app: ChordbeatCelery, node: str) -> list[dict[str, Any]]:
    """The tasks a worker's pool is running, as the worker itself reports them."""
    replies = app.control.inspect(timeout=1).active() or {}
    return [task for name, tasks in replies.items() if name.startswith(f"{node}@") for task in tasks]


@pytest.mark.slow
def test_a_worker_killed_while_its_claim_waits_on_the_database_strands_nothing(
    app: ChordbeatCelery, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    with processes.worker(settings, tmp_path, "w1") as w1:
        call(client, "chordbeat.apply_schedule", definition={"name": "held", "every": 3600, "steps": [step("a")]})
        execution_id, effects = start_and_hold(app, "held")
        with claims_blocked(settings.database_url):
            apply_effects(app, effects)
            # The worker's pool runs the step's runner, whose claim now waits on the database.
            wait_for(
                # ("name" is the step's readable shadow name; "type" the task.)
                lambda: any(w.get("type") == "chordbeat.run_step" for w in active_on(app, "w1")),
                30,
                what="the runner to be waiting on its claim",
            )
            w1.kill()
    with processes.worker(settings, tmp_path, "w2"), processes.beat(settings, tmp_path):
        done = final(app, execution_id, timeout=60)
    assert done["status"] == "completed", done
    assert [a["status"] for a in done["activities"]] == ["complete"]


_OUTCOME_WAITING = text(
    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'WITH dropped AS%'"
)


@pytest.mark.slow
def test_a_worker_killed_while_its_outcome_waits_on_the_database_does_not_run_the_step_again(
    app: ChordbeatCelery, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    """The step ran: its outcome, one statement on PostgreSQL, commits once the database lets it,
    whether or not the worker that sent it is still there, and the run goes on without a second run
    of the step. (In a transaction, as on SQLite, the outcome is lost with its worker and recovery
    runs the step again, as after any crash of a worker mid-step.)"""
    url = make_url(settings.database_url)
    if url.get_backend_name() != "postgresql":
        pytest.skip("SQLite records an outcome in a transaction: lost with its worker, the step runs again")
    log = tmp_path / "steps.log"
    env = processes.FAULT_TASKS_ENV
    locker = create_engine(settings.database_url)

    def outcome_waits() -> bool:
        # A connection of its own: a transaction sees pg_stat_activity as it was when first read.
        with locker.connect() as watcher:
            return watcher.execute(_OUTCOME_WAITING).scalar_one() > 0

    with processes.worker(settings, tmp_path, "w1", env=env) as w1:
        call(client, "chordbeat.apply_schedule", definition={"name": "ran", "every": 3600, "steps": [tick(log, 2)]})
        execution_id = call(client, "chordbeat.trigger_schedule", name="ran")["execution_id"]
        wait_for(lambda: any(e["event"] == "tick" for e in read_log(str(log))), 30, what="the step to run")
        with locker.connect() as connection:
            connection.execute(text("LOCK TABLE activities IN EXCLUSIVE MODE"))
            wait_for(outcome_waits, 30, what="the outcome to wait on the lock")
            w1.kill()
            connection.rollback()
    wait_for(lambda: activities(app, execution_id)[0].status.value == "complete", 10, what="the outcome to commit")
    with processes.worker(settings, tmp_path, "w2", env=env), processes.beat(settings, tmp_path):
        done = final(app, execution_id, timeout=60)
    locker.dispose()
    assert done["status"] == "completed", done
    assert [(a["attempt"], a["status"]) for a in done["activities"]] == [(1, "complete")]
    assert [e["attempt"] for e in read_log(str(log)) if e["event"] == "end"] == [1]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_claim_the_database_refuses_is_run_once_the_database_is_back(
    app: ChordbeatCelery, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    url = make_url(settings.database_url)
    if url.get_backend_name() != "postgresql":
        pytest.skip("a refused connection is PostgreSQL's; SQLite's busy claim is the test above")
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")

    def allow(allowed: bool) -> None:
        with admin.connect() as connection:
            connection.execute(text(f"ALTER DATABASE {url.database} ALLOW_CONNECTIONS {str(allowed).lower()}"))
            if not allowed:
                connection.execute(
                    text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :db"),
                    {"db": url.database},
                )

    with processes.worker(settings, tmp_path, "w1") as w1, processes.beat(settings, tmp_path):
        call(client, "chordbeat.apply_schedule", definition={"name": "refused", "every": 3600, "steps": [step("a")]})
        execution_id, effects = start_and_hold(app, "refused")
        allow(False)  # PostgreSQL restarting: every connection refused, existing ones reset
        try:
            apply_effects(app, effects)
            wait_for(lambda: "claiming worker task" in w1.output(), 60, what="the claim to fail")
            time.sleep(6)  # the outage's length (longer than recovery's re-send grace), not a synchronisation
        finally:
            allow(True)
        back = utcnow()
        done = final(app, execution_id, timeout=60)
    admin.dispose()
    assert done["status"] == "completed", done
    started = activities(app, execution_id)[0].started_at
    waited = (started - back).total_seconds()
    print(
        f"\ndatabase back to the refused step running: {waited:.1f}s (recovery every {settings.recovery_interval_s}s)"
    )
    assert waited <= 2 * settings.recovery_interval_s + 3, waited


def test_a_timed_out_step_that_unwinds_slowly_is_not_run_again(
    app: ChordbeatCelery, worker: Any, client: Celery, tmp_path: Path
) -> None:
    log = tmp_path / "steps.log"
    ttl = app.settings.heartbeat_ttl_s
    definition = {"name": "slow-unwind", "every": 3600, "steps": [tick(log, 30, unwind_s=2 * ttl, timeout=1)]}
    call(client, "chordbeat.apply_schedule", definition=definition)
    execution_id = call(client, "chordbeat.trigger_schedule", name="slow-unwind")["execution_id"]

    def ended() -> dict[str, Any] | None:
        recovery.recover(app)  # as the periodic task would, while the step unwinds
        done = db_execution(app, execution_id)
        return done if done["status"] != "in_progress" else None

    done = wait_for(ended, 60, interval=0.5, what="the run to end")
    assert isinstance(done, dict)
    assert done["status"] == "failed"
    assert [(a["attempt"], a["status"], a["error"]) for a in done["activities"]] == [
        (1, "failed_with_error", "timed out after 1s")
    ]
    assert [e["attempt"] for e in read_log(str(log)) if e["event"] == "start"] == [1]


@pytest.mark.slow
def test_a_step_calling_sys_exit_fails_once_and_the_pool_process_lives(
    app: ChordbeatCelery, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    log = tmp_path / "steps.log"
    with (
        processes.worker(settings, tmp_path, "w1", env=processes.FAULT_TASKS_ENV) as w1,
        processes.beat(settings, tmp_path),
    ):
        definition = {
            "name": "exits",
            "every": 3600,
            "steps": [{"name": "bye", "task": "faults.exit", "kwargs": {"log": str(log)}}],
        }
        call(client, "chordbeat.apply_schedule", definition=definition)
        execution_id = call(client, "chordbeat.trigger_schedule", name="exits")["execution_id"]
        done = finished(client, execution_id, timeout=60)
        assert "WorkerLostError" not in w1.output()
    assert done["status"] == "failed"
    assert [(a["attempt"], a["error"]) for a in done["activities"]] == [(1, "SystemExit: 3")]
    assert len([e for e in read_log(str(log)) if e["event"] == "start"]) == 1


def test_one_corrupt_run_does_not_stop_recovery_of_the_others(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    call(client, "chordbeat.apply_schedule", definition={"name": "bad", "every": 3600, "steps": [step("a")]})
    call(client, "chordbeat.apply_schedule", definition={"name": "good", "every": 3600, "steps": [step("a")]})
    bad, _ = start_and_hold(app, "bad")
    good, _ = start_and_hold(app, "good")
    past = utcnow().replace(year=2000)
    with transaction(app.settings.database_url) as session:
        # Both look stuck (nothing queued, started long ago); the first one's plan is unreadable.
        session.execute(update(ScheduleExecution).values(started_at=past))
        session.execute(text("DELETE FROM worker_tasks"))
        session.execute(update(ScheduleExecution).where(ScheduleExecution.id == bad).values(plan=[]))
    report = recovery.recover(app)
    assert report.unstuck == [good]
    assert db_execution(app, good)["status"] == "failed"  # advanced: its lost step counts as failed
    assert db_execution(app, bad)["status"] == "in_progress"


@pytest.mark.slow
def test_a_terminated_pool_process_loses_its_attempt_it_does_not_fail_the_step(
    app: ChordbeatCelery, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    """SIGTERM to a pool process (the worker shutting it down) is not the step's own SystemExit."""
    log = tmp_path / "steps.log"
    with processes.worker(settings, tmp_path, "w1", env=processes.FAULT_TASKS_ENV), processes.beat(settings, tmp_path):
        call(client, "chordbeat.apply_schedule", definition={"name": "term", "every": 3600, "steps": [tick(log, 4)]})
        execution_id = call(client, "chordbeat.trigger_schedule", name="term")["execution_id"]
        started = wait_for(lambda: [e for e in read_log(str(log)) if e["event"] == "tick"], 30, what="the step to run")
        assert isinstance(started, list)
        os.kill(started[0]["pid"], signal.SIGTERM)
        done = final(app, execution_id)
    assert done["status"] == "completed", done
    first, second = done["activities"]
    assert (first["attempt"], first["status"]) == (1, "failed_with_error")
    assert first["error"].startswith("worker lost"), first["error"]
    assert (second["attempt"], second["status"]) == (2, "complete")


def test_a_pooled_connection_the_server_closed_is_replaced_before_use(database_url: str) -> None:
    """What pool_pre_ping did, without its round trip per transaction: a connection resting in the
    pool that PostgreSQL closed (a restart, an administrator, an idle timeout) is not handed out."""
    url = make_url(database_url)
    if url.get_backend_name() != "postgresql":
        pytest.skip("SQLite has no server to close a connection")
    with connection(database_url) as conn:
        backend = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            assert conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": backend}).scalar_one()

        def gone() -> bool:
            with admin.connect() as conn:
                query = text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid")
                return conn.execute(query, {"pid": backend}).scalar_one() == 0

        wait_for(gone, 10, what="the terminated backend to exit")
    finally:
        admin.dispose()
    with connection(database_url) as conn:
        assert conn.execute(text("SELECT pg_backend_pid()")).scalar_one() != backend


@pytest.mark.parametrize(("query", "limit"), [({}, PG_CONNECT_TIMEOUT_S), ({"connect_timeout": "2"}, 2)])
def test_connecting_to_a_database_that_answers_nothing_fails_in_seconds(
    database_url: str, request: pytest.FixtureRequest, query: dict[str, str], limit: float
) -> None:
    """A frozen PostgreSQL (its postmaster stopped: the kernel accepts the TCP connection, nobody
    answers) held a new connection for as long as it stayed frozen: libpq waits for ever by default.
    Now it fails after PG_CONNECT_TIMEOUT_S, or after the URL's own ``connect_timeout``."""
    if make_url(database_url).get_backend_name() != "postgresql":
        pytest.skip("SQLite has no server to freeze")
    server: PostgresServer = request.getfixturevalue("postgres_server")
    postmaster = int((server.data / "postmaster.pid").read_text().split()[0])
    # A URL no engine was built for yet: its pool holds no connection to reuse.
    url = make_url(database_url).update_query_dict({"application_name": "frozen-server-test", **query})
    url_text = url.render_as_string(hide_password=False)
    with ThreadPoolExecutor(1) as pool:
        os.kill(postmaster, signal.SIGSTOP)
        try:
            started = time.monotonic()
            attempt = pool.submit(lambda: get_engine(url_text).connect().close())
            wait_for(attempt.done, limit + 10, interval=0.1, what="the connection attempt to give up")
            took = time.monotonic() - started
        finally:
            os.kill(postmaster, signal.SIGCONT)
    with pytest.raises(OperationalError, match="timeout"):
        attempt.result()
    assert limit - 1 <= took <= limit + 5, took
    get_engine(url_text).dispose()
