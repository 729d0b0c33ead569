"""Fixtures: real Redis, real PostgreSQL and SQLite databases, real in-process Celery workers."""

from __future__ import annotations

import gc
import itertools
import logging
import os
import shutil
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker
from celery.worker import state as worker_state
from sqlalchemy import create_engine, text

from celeryapp import app as chordbeat_app
from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.domain.names import PREFIX
from celeryapp.messaging.redis_client import get_redis, reset_clients
from models.migrate import upgrade
from models.session import dispose_all
from tests.support.helpers import tells_databases_apart
from tests.support.servers import PgBouncer, PostgresServer, RedisServer, wait_for
from tests.support.slowness import item_slow_reason, longest_first, record_start, started_but_not_slow

pytest_plugins = ("celery.contrib.pytest",)

TEMPLATE_DB = "chordbeat_template"
_db_numbers = itertools.count(1)
#: Result finalizers that run after Redis is stopped give up at once instead of retrying 20 s.
FAST_GIVE_UP = {"retry_policy": {"max_retries": 1, "interval_start": 0, "interval_step": 0.1}}


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    yield server
    # Results of chords sent from worker threads stay subscribed until interpreter exit; their
    # finalizers would then find Redis gone. Nothing is lost by silencing them at the very end.
    gc.collect()
    for name in ("celery.backends.asynchronous", "celery.backends.redis"):
        logging.getLogger(name).disabled = True
    sys.unraisablehook = lambda _unraisable: None
    server.close()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    server = PostgresServer()
    server.start()
    engine = create_engine(server.url(), isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {TEMPLATE_DB}"))
    engine.dispose()
    upgrade(server.url(TEMPLATE_DB))
    yield server
    server.close()


@pytest.fixture(scope="session")
def pgbouncer(postgres_server: PostgresServer) -> Iterator[PgBouncer]:
    """PgBouncer in transaction pooling in front of the session's PostgreSQL."""
    server = PgBouncer(postgres_server)
    server.start()
    yield server
    server.close()


#: Modules whose database tests also run through PgBouncer in transaction pooling (a third
#: ``database_url``, ``pgbouncer``, besides SQLite and PostgreSQL): the step path, firing, recovery,
#: backfill and the dashboard's reads, chosen among the fast ones so that the suite grows by little.
PGBOUNCER_MODULES = frozenset(
    {
        "test_step_cost",
        "test_step_claims",
        "test_fire_batch",
        "test_recovery",
        "test_backfill_driver",
        "test_web",
        "test_pgbouncer",
    }
)
#: Where a database test runs unless it says otherwise: SQLite. PostgreSQL only where behaviour
#: can differ (claims, locks, compare-and-set, outages, SQL paths): a test or module marked
#: ``both_databases`` runs on both, one parametrized ``database_url`` itself keeps its choice
#: (docs/testing.md lists which modules run twice and why the others need not).
DEFAULT_DATABASES = ("sqlite",)
BOTH_DATABASES = ("sqlite", "postgresql")


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Before pytest parametrizes: the databases a test using ``database_url`` runs on."""
    if "database_url" not in metafunc.fixturenames:
        return
    # A module that gives ``database_url`` a meaning of its own (test_query_plans' history) keeps it.
    fixturedefs = metafunc._arg2fixturedefs.get("database_url", ())
    if not fixturedefs or fixturedefs[-1].func.__module__ != __name__:
        return
    # A test that chooses its databases itself keeps its choice.
    if any("database_url" in str(m.args[0]) for m in metafunc.definition.iter_markers("parametrize")):
        return
    module = metafunc.module.__name__.rpartition(".")[2]
    if module in PGBOUNCER_MODULES:
        databases: tuple[str, ...] = (*BOTH_DATABASES, "pgbouncer")
    elif metafunc.definition.get_closest_marker("both_databases") is not None:
        databases = BOTH_DATABASES
    else:
        databases = DEFAULT_DATABASES
        if tells_databases_apart(metafunc.function.__code__):
            pytest.fail(
                f"{metafunc.definition.nodeid} tells the databases apart but runs on SQLite only:"
                " mark it both_databases (docs/testing.md)",
                pytrace=False,
            )
    metafunc.definition.add_marker(pytest.mark.parametrize("database_url", databases, indirect=True), append=False)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sqlite") / "template.db"
    upgrade(f"sqlite:///{path}")
    dispose_all()
    return path


@pytest.fixture
def database_url(request: pytest.FixtureRequest, tmp_path: Path, sqlite_template: Path) -> Iterator[str]:
    """A freshly migrated database per test: SQLite, PostgreSQL or PostgreSQL through PgBouncer,
    as ``pytest_generate_tests`` chose (SQLite when asked for by name, ``getfixturevalue``)."""
    kind = getattr(request, "param", "sqlite")
    if kind == "sqlite":
        path = tmp_path / "chordbeat.db"
        shutil.copy(sqlite_template, path)
        yield f"sqlite:///{path}"
    else:
        server: PostgresServer = request.getfixturevalue("postgres_server")
        name = f"test_{next(_db_numbers)}"
        engine = create_engine(server.url(), isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE_DB}"))
        engine.dispose()
        yield request.getfixturevalue("pgbouncer").url(name) if kind == "pgbouncer" else server.url(name)
    dispose_all()


@pytest.fixture
def settings(redis_server: RedisServer, database_url: str, tmp_path: Path) -> Settings:
    return Settings(
        broker_url=redis_server.url,
        result_backend=redis_server.url,
        redbeat_url=redis_server.url,
        database_url=database_url,
        # Short timings keep crash tests fast; CHORDBEAT_TEST_DEFAULT_TIMINGS=1 measures the defaults.
        **(
            {} if os.environ.get("CHORDBEAT_TEST_DEFAULT_TIMINGS") else {"heartbeat_ttl_s": 3, "recovery_interval_s": 1}
        ),
        health_dir=str(tmp_path),
    )


@pytest.fixture
def app(settings: Settings, redis_server: RedisServer) -> Iterator[ChordbeatCelery]:
    """The real chordbeat app, pointed at this test's Redis and database."""
    freeze_what_every_test_shares()
    redis.Redis.from_url(redis_server.url).flushall()
    reset_clients()
    previous = chordbeat_app.settings
    chordbeat_app.apply_settings(settings)
    if settings.broker_url != previous.broker_url or settings.result_backend != previous.result_backend:
        _forget_connections(chordbeat_app)
    chordbeat_app.conf.result_backend_transport_options = {
        **chordbeat_app.conf.result_backend_transport_options,
        **FAST_GIVE_UP,
    }
    chordbeat_app.loader.import_default_modules()
    yield chordbeat_app
    gc.collect()
    chordbeat_app.apply_settings(previous)
    if settings.broker_url != previous.broker_url or settings.result_backend != previous.result_backend:
        _forget_connections(chordbeat_app)


def freeze_what_every_test_shares() -> None:
    """Once per process, before the first app is set up: what lives then (modules, the session's
    servers, pytest's items) moves to the permanent generation (gc.freeze), so the full
    collection after every test (the fixtures' gc.collect) only walks what tests made since: it
    took a quarter second per test walking some 220,000 objects of modules. What is frozen is
    alive, and what tests make is collected as before."""
    global _FROZEN
    if not _FROZEN:
        gc.collect()
        gc.freeze()
        _FROZEN = True


_FROZEN = False


def _forget_connections(app: ChordbeatCelery) -> None:
    """Celery keeps its broker pools and result backend from the URLs it first used: a test on a
    Redis of its own (the lab's, a Sentinel group) would publish to the session's Redis."""
    app._pool = None
    app.amqp._producer_pool = None
    app._backend_cache = None
    app._local = threading.local()


@pytest.fixture
def worker(app: ChordbeatCelery) -> Iterator[Any]:
    """A real Celery worker in this process: thread pool, all of chordbeat's queues."""
    # Revoked ids live in process memory; each test starts from fresh databases.
    worker_state.revoked.clear()
    stopped = threading.Event()
    try:
        with start_worker(
            app, pool="threads", concurrency=4, perform_ping_check=False, shutdown_timeout=30, loglevel="WARNING"
        ) as w:
            yield w
            # Let steps still running (a cancelled one stopping, say) finish against this test's
            # database before the settings change under them.
            client = get_redis(app.settings.broker_url)
            wait_for(lambda: not client.keys(f"{PREFIX}:hb:*"), 20, what="running steps to end")
            # Stopping, the worker's broker channel reads the reply of the BRPOP it has waiting
            # (kombu, so that a message popped meanwhile is not lost), which with no message comes
            # at BRPOP's one-second timeout: a second per test. Blocked BRPOPs are unblocked while
            # it stops (CLIENT UNBLOCK: the reply is the timeout's, nothing is popped).
            threading.Thread(target=_unblock_reads_until, args=(client, stopped), daemon=True).start()
    finally:
        stopped.set()


def _unblock_reads_until(client: redis.Redis, stopped: threading.Event) -> None:
    while not stopped.wait(0.02):
        for connection in client.client_list():
            if connection.get("cmd") == "brpop" and "b" in connection.get("flags", ""):
                client.client_unblock(connection["id"])


@pytest.fixture
def client(settings: Settings) -> Iterator[Celery]:
    """What another service has: plain Celery and the URLs, none of chordbeat's code."""
    client = Celery("other-service", broker=settings.broker_url, backend=settings.result_backend, set_as_current=False)
    client.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        result_backend_transport_options=FAST_GIVE_UP,
    )
    yield client
    # Drop pending results now: their finalizers talk to Redis, which may be gone later.
    gc.collect()
    client.close()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark slow what starts workers, beat, browsers, outages... (tests/support/slowness.py), before
    ``-m "not slow"`` (plain pytest, make test-fast) deselects."""
    for item in items:
        reason = item_slow_reason(item)
        if reason is not None:
            item.add_marker(pytest.mark.slow(found=reason))
    longest_first(items)


def pytest_report_header(config: pytest.Config) -> str | None:
    """Say that the slow tests are left out when plain `pytest` (pyproject's -m) leaves them."""
    if config.getoption("markexpr") == "not slow":
        return 'slow tests left out (workers, beat, browsers, outages, the lab): -m "" runs them, as make test does'
    return None


sys.addaudithook(record_start)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    started_but_not_slow(None)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """A test not marked slow that started a worker, beat, a browser... is a gap in the finding:
    it fails here rather than slip into the quick loop (plain pytest) unnoticed."""
    started = started_but_not_slow(item)
    if started:
        pytest.fail(f"{item.nodeid} started {started} but is not marked slow (see tests/support/slowness.py)")
