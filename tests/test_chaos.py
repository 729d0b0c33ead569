"""Chaos: a mixed load under a seeded plan of faults, then the reliability invariants.

Real Redis (with an append-only file, so it can come back with or without its data), real
PostgreSQL (its own cluster, stopped and started during the plan) and SQLite, subprocess prefork
workers and beat. The load: several interval schedules and a minutely cron one, with parallel
groups, ``continue_on_failure``, run retries (``max_retries``), step and execution timeouts, and
the overlap policies, all running :data:`tests.support.chaos_tasks.STEP_TASK`, which logs each start and
end of its body. Faults are described in :mod:`tests.support.chaos`, the invariants in
:mod:`tests.support.chaos_invariants`.

Knobs (environment): :mod:`tests.support.chaos_run`; the long plan adds ``db_outage_long``.

A third plan runs on PostgreSQL through PgBouncer in transaction pooling (:data:`PGBOUNCER_PLAN_KINDS`,
its first fault a PgBouncer restart), :data:`PGBOUNCER_SECONDS` long unless a knob says.

``pytest -s`` shows the plan, the measurements and the violations; they are also written to
``chaos-report.json`` in the test's temporary directory.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from celeryapp.config import Settings
from models.migrate import upgrade
from tests.support.chaos import FAULT_KINDS, POOLER_KINDS, SHORT_PLAN_KINDS, Cluster, Database
from tests.support.chaos_run import (
    OVERHEAD_S,
    PLANS,
    SECONDS,
    SETTLE_S,
    announced_plan,
    base_seed,
    fault_kinds,
    plan_seconds,
    play_and_check,
    report,
)
from tests.support.servers import PgBouncer, PostgresServer, RedisServer

pytestmark = pytest.mark.slow

SEED = base_seed()


@pytest.fixture(scope="module")
def chaos_postgres() -> Iterator[PostgresServer]:
    """A cluster of the suite's own: the plan stops and starts it."""
    server = PostgresServer()
    server.start()
    engine = create_engine(server.url(), isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text("CREATE DATABASE chaos_template"))
    engine.dispose()
    upgrade(server.url("chaos_template"))
    yield server
    server.close()


@pytest.fixture(scope="module")
def chaos_pgbouncer(chaos_postgres: PostgresServer) -> Iterator[PgBouncer]:
    """PgBouncer in transaction pooling in front of the suite's cluster: the plan kills it."""
    server = PgBouncer(chaos_postgres)
    server.start()
    yield server
    server.close()


#: What a plan through PgBouncer draws from: its restarts, and the faults a database and its
#: clients meet behind it (the database itself going away, workers killed or frozen, beat killed).
PGBOUNCER_PLAN_KINDS = (*POOLER_KINDS, "db_outage", "worker_kill", "worker_stop", "beat_kill")
#: Its default load: a third shorter than the other plans', still four or five faults after the
#: first restart (what it adds to the suite is the path through the pooler, not the length).
PGBOUNCER_SECONDS = plan_seconds(40)


def new_database(kind: str, tmp: Path, request: pytest.FixtureRequest) -> Database:
    if kind == "sqlite":
        path = tmp / "chordbeat.db"
        shutil.copy(request.getfixturevalue("sqlite_template"), path)
        return Database(f"sqlite:///{path}", sqlite_path=path)
    server: PostgresServer = request.getfixturevalue("chaos_postgres")
    pooler: PgBouncer | None = request.getfixturevalue("chaos_pgbouncer") if kind == "pgbouncer" else None
    name = f"chaos_{uuid.uuid4().hex[:12]}"
    engine = create_engine(server.url(), isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name} TEMPLATE chaos_template"))
    engine.dispose()
    url = server.url(name) if pooler is None else pooler.url(name)
    return Database(url, postgres=server, pooler=pooler)


def run_plan(kind: str, index: int, seed: int, kinds: tuple[str, ...], root: Path, request: Any) -> dict[str, Any]:
    tmp = root / f"plan-{index}"
    tmp.mkdir()
    workers = ("w1", "w2")
    first = POOLER_KINDS[0] if kind == "pgbouncer" else None
    seconds = PGBOUNCER_SECONDS if kind == "pgbouncer" else SECONDS
    plan = announced_plan(f"on {kind}", index, seed, kinds, workers, first, seconds)
    redis = RedisServer(persistent=True)
    redis.start()
    database = new_database(kind, tmp, request)
    settings = Settings(
        broker_url=redis.url,
        result_backend=redis.url,
        redbeat_url=redis.url,
        database_url=database.url,
        heartbeat_ttl_s=3,
        recovery_interval_s=1,
        health_dir=str(tmp),
        task_modules=("tests.support.chaos_tasks",),
    )
    cluster = Cluster(settings, tmp, redis, database, worker_names=workers)
    try:
        result = play_and_check(cluster, plan, tmp / "steps.jsonl", seed, seconds)
    finally:
        redis.close()
    return {"database": kind, "plan": index, **result}


@pytest.mark.timeout(PLANS * (SECONDS + SETTLE_S + OVERHEAD_S) + 60)
@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_invariants_hold_under_a_seeded_fault_plan(
    database: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    kinds = fault_kinds(SHORT_PLAN_KINDS, FAULT_KINDS)
    results = [run_plan(database, i, SEED + i, kinds, tmp_path, request) for i in range(PLANS)]
    report(f"chaos on {database}", SEED, results, tmp_path / "chaos-report.json")


@pytest.mark.timeout(PLANS * (SECONDS + SETTLE_S + OVERHEAD_S) + 60)
def test_invariants_hold_under_a_seeded_fault_plan_through_pgbouncer(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    kinds = fault_kinds(PGBOUNCER_PLAN_KINDS, (*PGBOUNCER_PLAN_KINDS, "db_outage_long"))
    results = [run_plan("pgbouncer", i, SEED + i, kinds, tmp_path, request) for i in range(PLANS)]
    report("chaos through pgbouncer", SEED, results, tmp_path / "chaos-report.json")
