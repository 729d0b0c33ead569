"""Fixtures: real Redis, real PostgreSQL and SQLite databases, real in-process Celery workers."""

from __future__ import annotations

import gc
import inspect
import itertools
import logging
import os
import shutil
import subprocess
import sys
import threading
import types
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
from celeryapp.messaging import keys
from celeryapp.messaging.redis_client import get_redis, reset_clients
from models.migrate import upgrade
from models.session import dispose_all
from tests.servers import PostgresServer, RedisServer, wait_for

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
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sqlite") / "template.db"
    upgrade(f"sqlite:///{path}")
    dispose_all()
    return path


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path, sqlite_template: Path) -> Iterator[str]:
    """A freshly migrated database per test, on SQLite and on PostgreSQL."""
    if request.param == "sqlite":
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
        yield server.url(name)
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
    with start_worker(
        app, pool="threads", concurrency=4, perform_ping_check=False, shutdown_timeout=30, loglevel="WARNING"
    ) as w:
        yield w
        # Let steps still running (a cancelled one stopping, say) finish against this test's
        # database before the settings change under them.
        client = get_redis(app.settings.broker_url)
        wait_for(lambda: not client.keys(f"{keys.PREFIX}:hb:*"), 20, what="running steps to end")


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


# --- The `slow` marker: found from what a test starts, so that no hand-kept list can rot. ---------
# `make test-fast` (pytest -m "not slow") leaves out every test that starts long-running processes
# of its own: subprocess workers, beat, Flower (tests.processes), Sentinel groups, browsers, network
# namespaces, a PostgreSQL of its own (initdb takes seconds), outages of Redis or PostgreSQL. A
# test is slow when its body, or a fixture it uses (directly or through other fixtures), reaches
# one of these through the functions and classes of tests/ it calls; tests slow for other reasons
# (bench-like sizes) keep a `@pytest.mark.slow` by hand. tests/test_markers.py guards the finding.

#: Objects whose use makes a test slow, besides anything from the modules in _SLOW_MODULE_PREFIXES:
#: a process of its own, a PostgreSQL of its own (initdb), and Celery's in-process worker, which
#: takes about a second to stop after every test (178 of them: half the fast suite's time).
_SLOW_OBJECTS: tuple[object, ...] = (subprocess.Popen, PostgresServer, start_worker)
#: Modules whose objects start a browser.
_SLOW_MODULE_PREFIXES = ("selenium",)
#: Names of what takes a server away for seconds: an outage of Redis, a stopped or frozen
#: (SIGSTOP) PostgreSQL, a Redis replica syncing for a failover (about 5 s).
_SLOW_ATTRIBUTES = frozenset({"outage", "stop_server", "SIGSTOP", "replicaof"})
#: Not followed: the session's Redis and PostgreSQL start once (tests.servers' Popen) and every
#: test, fast or slow, runs on them.
_SHARED_SERVER_MODULES = frozenset({"tests.servers"})
#: Programs that only slow tests may start (a fast test that does fails at teardown, see below).
SLOW_PROGRAMS = frozenset({"celery", "flower", "redis-sentinel", "chromium", "chromedriver", "ip", "nft"})


def slow_reason(func: object, _seen: set[int] | None = None) -> str | None:
    """What in ``func`` (a test or fixture function, a class, a module's function) starts something
    slow, following the functions and classes of tests/ it names; None when nothing does."""
    seen = set() if _seen is None else _seen
    func = inspect.unwrap(func) if callable(func) else func  # type: ignore[arg-type]
    if id(func) in seen:
        return None
    seen.add(id(func))
    if inspect.isclass(func):
        if not func.__module__.startswith("tests.") or func.__module__ in _SHARED_SERVER_MODULES:
            return None
        for member in vars(func).values():
            found = slow_reason(getattr(member, "fget", member), seen)
            if found is not None:
                return f"{func.__name__}: {found}"
        return None
    code = getattr(func, "__code__", None)
    if code is None:
        return None
    names = _names(code)
    if names & _SLOW_ATTRIBUTES:
        return f"calls {sorted(names & _SLOW_ATTRIBUTES)[0]}"
    module_globals: dict[str, Any] = getattr(func, "__globals__", {})
    for name in sorted(names):
        target = module_globals.get(name)
        if inspect.ismodule(target):
            candidates = [getattr(target, attr) for attr in sorted(names) if hasattr(target, attr)]
        else:
            candidates = [target] if target is not None else []
        for candidate in candidates:
            found = _slow_object(candidate, seen)
            if found is not None:
                return found
    return None


def _slow_object(target: object, seen: set[int]) -> str | None:
    if any(target is slow for slow in _SLOW_OBJECTS):
        return f"uses {getattr(target, '__qualname__', target)}"
    module = getattr(target, "__module__", None) or ""
    if isinstance(module, str) and module.startswith(_SLOW_MODULE_PREFIXES):
        return f"uses {module}"
    if module.startswith("tests.") and module not in _SHARED_SERVER_MODULES and callable(target):
        found = slow_reason(target, seen)
        if found is not None:
            return f"{getattr(target, '__qualname__', target)} -> {found}"
    return None


def _names(code: types.CodeType) -> set[str]:
    """Globals and attributes a code object and the functions nested in it name."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def item_slow_reason(item: pytest.Item) -> str | None:
    """Why ``item`` is slow: its body, or a fixture in its closure (the session-wide servers aside)."""
    found = slow_reason(getattr(item, "function", None))
    if found is not None:
        return found
    info = getattr(item, "_fixtureinfo", None)
    for name in item.fixturenames if info is not None else []:  # type: ignore[attr-defined]
        for fixturedef in info.name2fixturedefs.get(name, ()):
            if fixturedef.scope == "session":
                continue
            found = slow_reason(fixturedef.func)
            if found is not None:
                return f"fixture {name}: {found}"
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        reason = item_slow_reason(item)
        if reason is not None:
            item.add_marker(pytest.mark.slow(found=reason))


#: Programs started since the current test's setup began (argv[0] base names).
_started: list[str] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "subprocess.Popen":
        argv = args[1] if isinstance(args[1], (list, tuple)) else [args[0]]
        _started.append(os.path.basename(os.fsdecode(argv[0])))


sys.addaudithook(_audit)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _started.clear()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """A test not marked slow that started a worker, beat, a browser... is a gap in the finding
    above: it fails here rather than slip into `make test-fast` unnoticed."""
    started = sorted(set(_started) & SLOW_PROGRAMS)
    _started.clear()
    if started and item.get_closest_marker("slow") is None:
        pytest.fail(f"{item.nodeid} started {started} but is not marked slow (tests/conftest.py, slow_reason)")
