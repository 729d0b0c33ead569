"""PostgreSQL behind PgBouncer in transaction pooling (Debian 12's 1.18, which does not track
prepared statements): each transaction may run on another server connection, so nothing may
rely on what a server connection keeps between transactions (docs/operations.md)."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine, event, func, make_url, select, text

from celeryapp.application import ChordbeatCelery
from celeryapp.interfaces import service
from celeryapp.worker import database_patience, runner
from models import Activity, ActivityStatus, WorkerTask, get_engine, transaction
from models.session import autocommit
from tests.support.helpers import step
from tests.support.servers import PgBouncer, PostgresServer, wait_for

THROUGH_PGBOUNCER = pytest.mark.parametrize("database_url", ["pgbouncer"], indirect=True)


def _two_pooled_connections(url: str) -> None:
    """Two connections in the engine's pool: a worker thread's statements then go out on one and
    the next, and through PgBouncer on whichever server connection is free, as in a busy worker."""
    engine = get_engine(url)
    with engine.connect() as first, engine.connect() as second:
        first.execute(text("SELECT 1"))
        second.execute(text("SELECT 1"))


def _queued_group(app: ChordbeatCelery, name: str, width: int) -> list[int]:
    """The worker tasks of a run of a new schedule of one group ``width`` steps wide."""
    service.apply_schedule(app, {"name": name, "every": 3600, "steps": [[step(f"s{i}") for i in range(width)]]})
    execution_id = service.trigger_schedule(app, name)["execution_id"]
    with transaction(app.settings.database_url) as session:
        return list(
            session.scalars(
                select(WorkerTask.id).where(WorkerTask.execution_id == execution_id).order_by(WorkerTask.id)
            )
        )


def _run(app: ChordbeatCelery, task_ids: list[int]) -> list[dict[str, object]]:
    return [runner.run_step(app, task_id, 1, node="here") for task_id in task_ids]


def _activities(app: ChordbeatCelery) -> list[tuple[ActivityStatus, int]]:
    with transaction(app.settings.database_url) as session:
        rows = session.execute(
            select(Activity.status, func.count()).group_by(Activity.status).order_by(Activity.status)
        ).all()
    return [(status, count) for status, count in rows]


@THROUGH_PGBOUNCER
def test_the_step_path_runs_through_pgbouncer_in_transaction_pooling(app: ChordbeatCelery) -> None:
    """psycopg prepares a statement on the server after 5 executions on one connection; through
    PgBouncer the next transaction of that connection, or another client's, meets a server
    connection that does not have it, or has one of the same name (42P05, 26000)."""
    task_ids = _queued_group(app, "pooled", 24)
    _two_pooled_connections(app.settings.database_url)
    answers = _run(app, task_ids)
    assert answers == [{"status": "complete"}] * 24
    assert _activities(app) == [(ActivityStatus.COMPLETE, 24)]


@THROUGH_PGBOUNCER
def test_a_prepared_statement_refused_by_the_pooler_is_tried_again_on_a_fresh_connection(
    app: ChordbeatCelery, caplog: pytest.LogCaptureFixture
) -> None:
    """Connections that prepare every statement (as an older chordbeat, or another client of the
    pool, does): what PgBouncer's server connections refuse is a connection's fault, not the
    step's. Claims and outcomes are tried again on another connection, every step runs once, and
    none is left to recovery."""
    task_ids = _queued_group(app, "prepared", 12)
    engine = get_engine(app.settings.database_url)
    with engine.connect() as first, engine.connect() as second:
        for conn in (first, second):
            conn.connection.driver_connection.prepare_threshold = 0  # type: ignore[union-attr]
    caplog.set_level(logging.WARNING, logger=database_patience.__name__)
    answers = _run(app, task_ids)
    assert answers == [{"status": "complete"}] * 12
    assert _activities(app) == [(ActivityStatus.COMPLETE, 12)]
    refused = [r for r in caplog.records if "prepared statement" in r.getMessage()]
    assert refused, "no statement was refused: the test did not test anything"


@THROUGH_PGBOUNCER
def test_no_session_state_is_left_on_pgbouncers_server_connections(
    app: ChordbeatCelery, postgres_server: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Through a pooler the engine's connections prepare nothing and set nothing for the session:
    a server connection is shared by every client of its pool (here, a database whose default
    isolation level is not chordbeat's: the operator is told, nothing is changed behind them)."""
    database = make_url(app.settings.database_url).database
    engine = create_engine(postgres_server.url(), isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f"ALTER DATABASE {database} SET default_transaction_isolation = 'repeatable read'"))
    engine.dispose()
    caplog.set_level(logging.WARNING, logger="models.session")
    task_ids = _queued_group(app, "stateless", 12)
    _two_pooled_connections(app.settings.database_url)
    assert _run(app, task_ids) == [{"status": "complete"}] * 12
    with autocommit(app.settings.database_url) as conn:
        prepared = conn.execute(text("SELECT count(*) FROM pg_prepared_statements")).scalar_one()
        level = conn.execute(text("SHOW default_transaction_isolation")).scalar_one()
    assert prepared == 0
    assert level == "repeatable read"
    assert any("default_transaction_isolation" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("database_url", ["postgresql", "pgbouncer"], indirect=True)
def test_a_claim_committed_whose_answer_was_lost_is_run_by_its_runner(app: ChordbeatCelery) -> None:
    """The connection is cut on ``COMMIT`` after the server committed the claim (PgBouncer killed
    at that moment, a network cut): trying again finds nothing queued. The runner knows the claim
    it made and runs the step, once, as attempt 1, instead of leaving it to recovery to give up as
    lost and run again under another attempt number."""
    [task_id] = _queued_group(app, "cut", 1)
    cut: list[int] = []

    def commit_then_cut(conn: Any) -> None:
        if cut:
            return
        cut.append(task_id)
        driver = conn.connection.driver_connection
        driver.commit()  # the server commits the claim,
        driver.execute("SELECT 1")  # a transaction opens for SQLAlchemy's COMMIT to end,
        with socket.socket(fileno=os.dup(driver.fileno())) as sock:
            sock.shutdown(socket.SHUT_RDWR)  # whose answer never comes

    event.listen(get_engine(app.settings.database_url), "commit", commit_then_cut)
    assert runner.run_step(app, task_id, 1, node="here") == {"status": "complete"}
    assert cut == [task_id]
    with transaction(app.settings.database_url) as session:
        attempts = session.execute(select(Activity.attempt, Activity.status)).all()
        left = session.scalar(select(func.count()).select_from(WorkerTask))
    assert attempts == [(1, ActivityStatus.COMPLETE)]
    assert left == 0


@pytest.fixture
def one_server_connection(postgres_server: PostgresServer) -> Iterator[PgBouncer]:
    """A PgBouncer of one server connection a pool, whose clients wait for it 1 s at most."""
    bouncer = PgBouncer(postgres_server, pool_size=1, extra="query_wait_timeout = 1\n")
    bouncer.start()
    yield bouncer
    bouncer.close()


@pytest.mark.parametrize("database_url", ["pgbouncer"], indirect=True)
def test_a_claim_refused_by_pgbouncers_query_wait_timeout_is_tried_again(
    app: ChordbeatCelery, one_server_connection: PgBouncer, caplog: pytest.LogCaptureFixture
) -> None:
    """Every server connection busy past ``query_wait_timeout``: PgBouncer answers the claim with
    an error (08P01) and closes the connection. The database is away, not the step refused: the
    runner tries again until a server connection is free, and the step runs once."""
    [task_id] = _queued_group(app, "waiting", 1)
    url = one_server_connection.url(make_url(app.settings.database_url).database or "")
    app.apply_settings(dataclasses.replace(app.settings, database_url=url))
    caplog.set_level(logging.WARNING, logger=database_patience.__name__)
    answers: list[dict[str, Any]] = []
    holder = create_engine(url)
    try:
        with holder.begin() as held:
            held.execute(text("SELECT 1"))  # the pool's one server connection, held
            stepping = threading.Thread(target=lambda: answers.append(runner.run_step(app, task_id, 1, node="here")))
            stepping.start()
            wait_for(
                lambda: any("query_wait_timeout" in r.getMessage() for r in caplog.records),
                20,
                what="PgBouncer to refuse the claim",
            )
        stepping.join(30)
    finally:
        holder.dispose()
    assert answers == [{"status": "complete"}]
    with transaction(url) as session:
        attempts = session.execute(select(Activity.attempt, Activity.status)).all()
    assert attempts == [(1, ActivityStatus.COMPLETE)]
