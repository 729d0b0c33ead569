"""Chaos: a mixed load under a seeded plan of faults, then the reliability invariants.

Real Redis (with an append-only file, so it can come back with or without its data), real
PostgreSQL (its own cluster, stopped and started during the plan) and SQLite, subprocess prefork
workers and beat. The load: several interval schedules and a minutely cron one, with parallel
groups, ``continue_on_failure``, run retries (``max_retries``), step and execution timeouts, and
the overlap policies, all running :data:`tests.chaos_tasks.STEP_TASK`, which logs each start and
end of its body. Faults are described in :mod:`tests.chaos`, the invariants in
:mod:`tests.chaos_invariants`.

Knobs (environment):

- ``CHORDBEAT_CHAOS_SEED``: replay a plan (the seed is printed; plan ``i`` uses seed + i).
- ``CHORDBEAT_CHAOS_SECONDS`` (default 60) seconds of load and faults per plan;
  ``CHORDBEAT_CHAOS_PLANS`` (default 1) plans per database; ``CHORDBEAT_CHAOS_LONG=1`` means
  300 s, 3 plans and adds ``db_outage_long``.
- ``CHORDBEAT_CHAOS_FAULTS`` / ``CHORDBEAT_CHAOS_EXCLUDE``: comma-separated fault kinds to draw
  from / to leave out (``worker_kill,worker_stop,beat_kill,beat_stop,redis_restart_data,
  redis_restart_empty,db_outage,db_outage_long``).
- ``CHORDBEAT_CHAOS_SETTLE`` (default 90): seconds the system gets, once schedules are paused,
  to finish every execution; ``CHORDBEAT_CHAOS_BOUND`` (default 120): longest acceptable
  execution.

``pytest -s`` shows the plan, the measurements and the violations; they are also written to
``chaos-report.json`` in the test's temporary directory.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, func, select, text

from celeryapp.config import Settings
from models import Activity, ActivityStatus, ExecutionStatus, ScheduleExecution, WorkerTask, transaction
from models.migrate import upgrade
from models.session import dispose_all
from tests.chaos import (
    FAULT_KINDS,
    SHORT_PLAN_KINDS,
    Cluster,
    Database,
    harness_client,
    make_plan,
    plan_text,
    running,
)
from tests.chaos_invariants import Context, Violation, check_all, measurements, read_step_log, snapshot
from tests.chaos_tasks import STEP_TASK
from tests.helpers import call, wait_for
from tests.servers import PostgresServer, RedisServer

pytestmark = pytest.mark.slow

LONG = os.environ.get("CHORDBEAT_CHAOS_LONG") == "1"
SECONDS = float(os.environ.get("CHORDBEAT_CHAOS_SECONDS") or (300 if LONG else 60))
PLANS = int(os.environ.get("CHORDBEAT_CHAOS_PLANS") or (3 if LONG else 1))
SETTLE_S = float(os.environ.get("CHORDBEAT_CHAOS_SETTLE") or 90)
EXECUTION_BOUND_S = float(os.environ.get("CHORDBEAT_CHAOS_BOUND") or 120)
#: Seconds per plan beyond load and settling: servers, migrations, process start and stop.
OVERHEAD_S = 90


def fault_kinds() -> tuple[str, ...]:
    chosen = os.environ.get("CHORDBEAT_CHAOS_FAULTS")
    kinds = [k.strip() for k in chosen.split(",")] if chosen else list(FAULT_KINDS if LONG else SHORT_PLAN_KINDS)
    excluded = {k.strip() for k in os.environ.get("CHORDBEAT_CHAOS_EXCLUDE", "").split(",") if k.strip()}
    unknown = (set(kinds) | excluded) - set(FAULT_KINDS)
    if unknown:
        raise ValueError(f"CHORDBEAT_CHAOS_FAULTS/EXCLUDE: unknown fault kinds {sorted(unknown)}")
    return tuple(k for k in kinds if k not in excluded)


def base_seed() -> int:
    given = os.environ.get("CHORDBEAT_CHAOS_SEED")
    return int(given) if given else random.SystemRandom().randrange(1, 1_000_000)


SEED = base_seed()


def schedules(log: Path, seed: int) -> list[dict[str, Any]]:
    def step(name: str, sleep_max: float = 1.5, fail_rate: float = 0.0, **extra: Any) -> dict[str, Any]:
        kwargs = {"log": str(log), "seed": seed, "sleep_min": 0.2, "sleep_max": sleep_max, "fail_rate": fail_rate}
        return {"name": name, "task": STEP_TASK, "kwargs": kwargs, **extra}

    return [
        {
            # Parallel group with a tolerated failure; failed runs are retried twice.
            "name": "chaos-pipeline",
            "every": 4,
            "max_retries": 2,
            "timeout": 40,
            "steps": [
                step("prep", fail_rate=0.05),
                [step("fan-a"), step("fan-b", fail_rate=0.05), step("fan-c", fail_rate=0.3, continue_on_failure=True)],
                step("finish"),
            ],
        },
        {
            # A step timeout that often fires, and a short execution timeout.
            "name": "chaos-timeouts",
            "every": 5,
            "timeout": 12,
            "steps": [step("slow", sleep_max=1.6, timeout=1), step("after", sleep_max=0.3)],
        },
        {
            "name": "chaos-allow",
            "every": 3,
            "overlap": "allow",
            "steps": [[step("solo", sleep_max=2.5, fail_rate=0.1)]],
        },
        {
            "name": "chaos-buffer",
            "every": 6,
            "overlap": "buffer_one",
            "steps": [step("first", sleep_max=3.0), step("second", sleep_max=3.0)],
        },
        {"name": "chaos-cron", "cron": "* * * * *", "steps": [step("tick", sleep_max=0.3)]},
    ]


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


def new_database(kind: str, tmp: Path, request: pytest.FixtureRequest) -> Database:
    if kind == "sqlite":
        path = tmp / "chordbeat.db"
        shutil.copy(request.getfixturevalue("sqlite_template"), path)
        return Database(f"sqlite:///{path}", sqlite_path=path)
    server: PostgresServer = request.getfixturevalue("chaos_postgres")
    name = f"chaos_{uuid.uuid4().hex[:12]}"
    engine = create_engine(server.url(), isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name} TEMPLATE chaos_template"))
    engine.dispose()
    return Database(server.url(name), postgres=server)


def unfinished(url: str) -> int:
    with transaction(url, read_only=True) as session:
        in_progress = session.scalar(
            select(func.count()).where(ScheduleExecution.status == ExecutionStatus.IN_PROGRESS)
        )
        open_activities = session.scalar(select(func.count()).where(Activity.status == ActivityStatus.IN_PROGRESS))
        tasks = session.scalar(select(func.count()).select_from(WorkerTask))
    return (in_progress or 0) + (open_activities or 0) + (tasks or 0)


def settle(cluster: Cluster, names: list[str]) -> float:
    """Pause every schedule, then wait (bounded) until nothing is in progress; returns when it stopped."""
    deadline = time.monotonic() + SETTLE_S
    client = harness_client(cluster.settings)
    paused: set[str] = set()
    try:
        while time.monotonic() < deadline and len(paused) < len(names):
            for name in sorted(set(names) - paused):
                try:
                    call(client, "chordbeat.pause_schedule", name=name)
                    paused.add(name)
                except Exception as exc:  # workers may be restarting: try again until the deadline
                    print(f"pausing {name} failed ({type(exc).__name__}: {exc}); retrying")
        while time.monotonic() < deadline:
            try:
                if unfinished(cluster.database.url) == 0:
                    break
            except Exception as exc:
                print(f"settle poll failed: {exc}")
            time.sleep(0.5)
    finally:
        client.close()
    return time.time()


def run_plan(kind: str, index: int, seed: int, kinds: tuple[str, ...], root: Path, request: Any) -> dict[str, Any]:
    tmp = root / f"plan-{index}"
    tmp.mkdir()
    workers = ("w1", "w2")
    plan = make_plan(seed, SECONDS, kinds, workers)
    print(
        f"\n=== chaos plan {index} on {kind}: seed {seed}, {SECONDS:g}s; replay with "
        f"CHORDBEAT_CHAOS_SEED={seed - index} CHORDBEAT_CHAOS_SECONDS={SECONDS:g} "
        f"CHORDBEAT_CHAOS_FAULTS={','.join(kinds)}\n{plan_text(plan)}",
        flush=True,
    )
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
        task_modules=("tests.chaos_tasks",),
    )
    log = tmp / "steps.jsonl"
    definitions = schedules(log, seed)
    cluster = Cluster(settings, tmp, redis, database, worker_names=workers)
    try:
        with running(cluster):
            client = harness_client(settings)
            try:
                for definition in definitions:
                    wait_for(
                        lambda d=definition: call(client, "chordbeat.apply_schedule", definition=d),  # type: ignore[misc]
                        60,
                        interval=0.5,
                        what=f"applying {definition['name']}",
                    )
            finally:
                client.close()
            started = time.time()
            cluster.play(plan, started)
            if (left := started + SECONDS - time.time()) > 0:
                time.sleep(left)  # the rest of the load after the last fault
            firing_end = time.time()
            settled = settle(cluster, [d["name"] for d in definitions])
        ctx = Context(
            snapshot(database.url),
            read_step_log(log),
            cluster.applied,
            cluster.deaths,
            cluster.exits,
            started=started,
            firing_end=firing_end,
            settled=settled,
            execution_bound_s=EXECUTION_BOUND_S,
        )
    finally:
        dispose_all()
        redis.close()
    violations, slot_stats = check_all(ctx)
    return {
        "database": kind,
        "plan": index,
        "seed": seed,
        "faults": [a.as_json() for a in cluster.applied],
        "deaths": {str(pid): at for pid, at in cluster.deaths.items()},
        "exits": [{"name": x.name, "pid": x.pid, "code": x.code, "at": x.at} for x in cluster.exits],
        "started": started,
        "firing_end": firing_end,
        "fault_count": len(cluster.applied),
        "settle_s": round(settled - firing_end, 1),
        **measurements(ctx),
        **slot_stats,
        "violations": [str(v) for v in violations],
        "violations_by_invariant": dict(_count(violations)),
    }


def _count(violations: list[Violation]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for v in violations:
        counts[v.invariant] = counts.get(v.invariant, 0) + 1
    return counts


@pytest.mark.timeout(PLANS * (SECONDS + SETTLE_S + OVERHEAD_S) + 60)
@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_invariants_hold_under_a_seeded_fault_plan(
    database: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    kinds = fault_kinds()
    results = [run_plan(database, i, SEED + i, kinds, tmp_path, request) for i in range(PLANS)]
    report = {
        "seed": SEED,
        "plans": PLANS,
        "seconds": SECONDS,
        "faults_injected": sum(r["fault_count"] for r in results),
        "executions_checked": sum(r["executions"] for r in results),
        "results": results,
    }
    (tmp_path / "chaos-report.json").write_text(json.dumps(report, indent=2))
    recovery: dict[str, list[str]] = {}
    for r in results:
        for m in r["fault_end_to_first_step_s"]:
            took = m["first_step_s"]
            recovery.setdefault(m["fault"], []).append("none" if took is None else f"{took:.1f}s")
    print(
        f"\n=== chaos on {database}: seed {SEED}, {PLANS} plan(s), {report['faults_injected']} faults, "
        f"{report['executions_checked']} executions checked; fault end -> first step: "
        + ("; ".join(f"{kind} {', '.join(times)}" for kind, times in sorted(recovery.items())) or "no fault")
        + f"; report: {tmp_path / 'chaos-report.json'}"
    )
    for r in results:
        print(json.dumps({k: v for k, v in r.items() if k not in ("violations", "faults", "deaths", "exits")}))
    violations = [f"plan {r['plan']} (seed {r['seed']}): {v}" for r in results for v in r["violations"]]
    for line in violations:
        print(line)
    shown = "\n".join(violations[:40]) + (f"\n... and {len(violations) - 40} more" if len(violations) > 40 else "")
    assert not violations, f"{len(violations)} invariant violations (CHORDBEAT_CHAOS_SEED={SEED}):\n{shown}"
