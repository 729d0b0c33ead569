"""Chaos for shared limits: many acquire/release cycles of small limits while workers are
SIGKILLed (and one frozen: SIGSTOP for 1-8 s, past the heartbeat TTL, so its steps' slots are
given to others while it sleeps and its late outcomes must give back nothing), Redis fails over
(a Sentinel group: the primary SIGKILLed or ``SENTINEL FAILOVER``) and PostgreSQL restarts, then
the chaos suite's invariants and the limits' own (:mod:`tests.support.chaos_limits`): in use
never above slots (sampled every 100 ms), no slot held by an attempt that has ended, no waiter
stuck.

The load (:func:`cycle_load`): three schedules firing every second or two whose steps use two
limits, one of 3 slots and one of 4 keyed per schedule with 2 slots a key, one step taking 2
slots of one and a slot of the other at once; more steps than slots in every run, so steps wait
for each other within a run and across schedules. The plan (:func:`cycle_plan`): three worker
SIGKILLs, one SIGSTOP, one Sentinel failover and one PostgreSQL restart (``pg_ctl -m fast``,
every connection cut), in an order and at times drawn from the seed; after the plan the load
goes on until the limits have admitted :data:`CYCLES` steps.

Knobs: ``CHORDBEAT_CHAOS_SEED`` replays a plan; ``CHORDBEAT_CHAOS_CYCLES`` (default 300;
``CHORDBEAT_CHAOS_LONG=1``: 1,000) the admissions to reach. ``make test`` runs it on PostgreSQL
with 300 (about 75-90 s); either knob adds SQLite (the database outage there: another
connection holding ``BEGIN EXCLUSIVE``). ``pytest -s`` shows the plan and the figures (cycles,
the most in use seen against the slots, leaked slots, a killed holder's time to release); they
are also in ``chaos-limits-report.json`` in the test's temporary directory.
"""

from __future__ import annotations

import os
import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from models.migrate import upgrade
from tests.support.chaos import DURATIONS_S, GAP_S, WARMUP_S, Database, Fault, plan_text
from tests.support.chaos_lab import FailoverCluster, sentinel_settings
from tests.support.chaos_run import LONG, OVERHEAD_S, SETTLE_S, base_seed, play_and_check, report
from tests.support.chaos_tasks import STEP_TASK
from tests.support.sentinel import SentinelCluster
from tests.support.servers import PostgresServer

pytestmark = pytest.mark.slow

SEED = base_seed()
CYCLES = int(os.environ.get("CHORDBEAT_CHAOS_CYCLES") or (1000 if LONG else 300))
#: SQLite's leg runs when asked for: the chaos suite's plans already put its limits under faults
#: on SQLite in every run (tests/test_chaos.py).
ON_DEMAND = LONG or bool(os.environ.get("CHORDBEAT_CHAOS_CYCLES"))
ON_DEMAND_REASON = "on demand: CHORDBEAT_CHAOS_LONG=1 or CHORDBEAT_CHAOS_CYCLES=N"
#: The plan's faults, in an order the seed shuffles.
KINDS = ("worker_kill", "worker_kill", "worker_kill", "worker_stop", "sentinel_failover", "db_outage")
WORKERS = ("w1", "w2")


def cycle_plan(seed: int) -> list[Fault]:
    """Each of :data:`KINDS` once, in a seeded order, at seeded gaps and durations (as
    :func:`tests.support.chaos.make_plan` draws them)."""
    rng = random.Random(seed)
    kinds = list(KINDS)
    rng.shuffle(kinds)
    faults, t = [], WARMUP_S
    for kind in kinds:
        t += rng.uniform(*GAP_S)
        duration = round(rng.uniform(*DURATIONS_S[kind]), 1)
        if kind in ("worker_kill", "worker_stop"):
            target, how = rng.choice(WORKERS), ""
        elif kind == "sentinel_failover":
            target, how = "redis", rng.choice(("sigkill", "sentinel-failover"))
        else:
            target, how = "db", ""
        faults.append(Fault(round(t, 1), kind, target, duration, how=how))
        t += duration
    return faults


def cycle_load(log: Path, seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The limits and the schedules of the cycles' load."""

    def step(name: str, **extra: Any) -> dict[str, Any]:
        kwargs = {"log": str(log), "seed": seed, "sleep_min": 0.02, "sleep_max": 0.25}
        return {"name": name, "task": STEP_TASK, "kwargs": kwargs, **extra}

    limits = [
        {"name": "cycle-pool", "slots": 3},
        {"name": "cycle-keyed", "slots": 4, "key": "{schedule}", "per_key_slots": 2},
    ]
    schedules = [
        {
            # Six steps through three slots: half of them wait for the others' releases.
            "name": "cycles-pool",
            "every": 1,
            "overlap": "buffer_one",
            "uses": ["cycle-pool"],
            "steps": [[step(f"p{i}") for i in range(6)]],
        },
        {
            # Four steps through their key's two slots, then one step using both limits.
            "name": "cycles-keyed",
            "every": 1,
            "overlap": "buffer_one",
            "uses": ["cycle-keyed"],
            "steps": [[step(f"k{i}") for i in range(4)], step("both", uses=[{"limit": "cycle-pool", "slots": 2}])],
        },
        {
            "name": "cycles-mixed",
            "every": 2,
            "overlap": "allow",
            "steps": [[step("m0", uses=["cycle-pool", "cycle-keyed"]), step("m1", uses=["cycle-keyed"]), step("m2")]],
        },
    ]
    return limits, schedules


@pytest.fixture(scope="module")
def cycles_postgres() -> Iterator[PostgresServer]:
    """A cluster of the module's own: the plan restarts it."""
    server = PostgresServer()
    server.start()
    server.create_database("cycles_template")
    upgrade(server.url("cycles_template"))
    yield server
    server.close()


def new_database(kind: str, tmp: Path, request: pytest.FixtureRequest) -> Database:
    if kind == "sqlite":
        path = tmp / "chordbeat.db"
        path.write_bytes(Path(request.getfixturevalue("sqlite_template")).read_bytes())
        return Database(f"sqlite:///{path}", sqlite_path=path)
    server: PostgresServer = request.getfixturevalue("cycles_postgres")
    name = f"cycles_{uuid.uuid4().hex[:12]}"
    engine = create_engine(server.url(), isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name} TEMPLATE cycles_template"))
    engine.dispose()
    return Database(server.url(name), postgres=server)


#: Seconds of the run beyond the plan: the cycles after it (a loaded machine admits about 5 a second).
CYCLES_S = CYCLES / 5


@pytest.mark.timeout(60 + len(KINDS) * (8 + 5) + CYCLES_S + SETTLE_S + OVERHEAD_S)
@pytest.mark.parametrize(
    "database",
    ["postgresql", pytest.param("sqlite", marks=pytest.mark.skipif(not ON_DEMAND, reason=ON_DEMAND_REASON))],
)
def test_limits_hold_through_kills_a_failover_and_a_database_restart(
    database: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """0 over-admissions (sampled every 100 ms, and by the bodies that ran), 0 leaked slots, no
    waiter stuck, over :data:`CYCLES` admissions; the rest of the chaos suite's invariants too."""
    plan = cycle_plan(SEED)
    seconds = plan[-1].at_s + plan[-1].duration_s + 5
    print(
        f"\n=== limit cycles on {database}: seed {SEED}, {CYCLES} cycles; replay with CHORDBEAT_CHAOS_SEED={SEED} "
        f"CHORDBEAT_CHAOS_CYCLES={CYCLES}\n{plan_text(plan)}",
        flush=True,
    )
    database_under_test = new_database(database, tmp_path, request)
    sentinels = SentinelCluster()
    sentinels.start()
    try:
        settings = sentinel_settings(sentinels, database_under_test.url, str(tmp_path))
        cluster = FailoverCluster(
            settings, tmp_path, None, database_under_test, worker_names=WORKERS, sentinels=sentinels
        )
        log = tmp_path / "steps.jsonl"
        result = play_and_check(cluster, plan, log, SEED, seconds, load=cycle_load(log, SEED), cycles=CYCLES)
    finally:
        sentinels.close()
    result = {"database": database, "plan": 0, **result}
    report(f"limit cycles on {database}", SEED, [result], tmp_path / "chaos-limits-report.json")
    assert result["limit_cycles"] >= CYCLES
    assert result["limit_leaked_slots"] == 0
