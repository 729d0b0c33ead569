"""Advancement latency, step throughput, worker memory and per-step costs: chordbeat and raw Celery.

Both run a prefork worker (-c 2) on the same Redis. chordbeat runs with its beat (recovery,
reconcile) and PostgreSQL, as in production; timings come from the activity rows. Raw Celery's
no-op tasks push their own start and end to Redis.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Engine, select, text

from bench import raw_app
from bench.harness import OBSERVER, Bench, children, cpu_by_process, cpu_used, pss_mib, rss_mib, running, trigger
from bench.stats import gaps_ms, group_bounds, percentiles, throughput
from celeryapp.client import ChordbeatClient
from models import Activity, ExecutionStatus, ScheduleExecution
from tests.support.servers import wait_for

#: One pipeline alone: 20 groups of 4 no-op steps.
ALONE = (1, 20, 4)
#: Under load: 100 pipelines of 5 groups of 2 no-op steps, started at once.
LOADED = (100, 5, 2)
NOOP = {"task": "chordbeat.examples.sleep", "kwargs": {"seconds": 0}}
Records = list[tuple[int, int, float, float]]

# Statements, and everything sent (BEGIN, with its isolation level or not, COMMIT, ROLLBACK too):
# each is a round trip, but for the rows of a multi-row upsert (pipelined, counted one each).
_STATEMENTS = text(
    """
    SELECT coalesce(sum(calls) FILTER (WHERE query NOT LIKE 'BEGIN%' AND query NOT IN ('COMMIT', 'ROLLBACK')), 0),
           coalesce(sum(calls), 0)
    FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid
    WHERE r.rolname = :user AND s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
    """
)
_OBSERVER_BACKENDS = text("SELECT pid FROM pg_stat_activity WHERE usename = :observer")


def _redis_commands(bench: Bench) -> int:
    return int(bench.redis_client().info("stats")["total_commands_processed"])


def _redis_bytes(bench: Bench) -> int:
    return int(bench.redis_client().info("memory")["used_memory"])


def _statements(engine: Engine, user: str) -> tuple[int, int]:
    with engine.connect() as conn:
        row = conn.execute(_STATEMENTS, {"user": user}).one()
    return int(row[0]), int(row[1])


def _observer_backends(observer: Engine) -> set[int]:
    with observer.connect() as conn:
        return set(conn.scalars(_OBSERVER_BACKENDS, {"observer": OBSERVER}))


def _processes(bench: Bench, roots: list[int], observer: Engine | None = None) -> dict[str, list[int]]:
    """The processes whose CPU a step costs: the worker with its pool (and beat), Redis, and with a
    database, PostgreSQL's processes but the benchmark's own connections."""
    groups = {"worker": [p for root in roots for p in [root, *children(root)]], "redis": [bench.redis_pid()]}
    if observer is not None:
        postmaster = bench.pg.postmaster_pid()
        ours = _observer_backends(observer)
        groups["database"] = [p for p in [postmaster, *children(postmaster)] if p not in ours]
    return groups


class CpuMeter:
    """CPU milliseconds per step of each group of processes, over a block of work."""

    def __init__(self, bench: Bench, roots: list[int], observer: Engine | None = None) -> None:
        self._bench, self._roots, self._observer = bench, roots, observer

    def __enter__(self) -> CpuMeter:
        self._before = {
            g: cpu_by_process(pids) for g, pids in _processes(self._bench, self._roots, self._observer).items()
        }
        return self

    def __exit__(self, *_: object) -> None:
        after = _processes(self._bench, self._roots, self._observer)
        self.seconds = {g: cpu_used(self._before[g], cpu_by_process(pids)) for g, pids in after.items()}

    def per_step(self, steps: int) -> dict[str, float]:
        used = {group: seconds * 1000 / steps for group, seconds in self.seconds.items()}
        return {**used, "all": sum(used.values())}


def _run_chordbeat(
    bench: Bench, client: ChordbeatClient, observer: Engine, name: str, shape: tuple[int, ...]
) -> Records:
    pipelines, groups, width = shape
    steps = [[{"name": f"g{g}s{s}", **NOOP} for s in range(width)] for g in range(groups)]
    client.apply_schedule({"name": name, "every": 86400, "overlap": "allow", "steps": steps})
    ids = [trigger(client, name) for _ in range(pipelines)]

    def finished() -> bool:
        with observer.connect() as conn:
            statuses = conn.scalars(select(ScheduleExecution.status).where(ScheduleExecution.id.in_(ids))).all()
        return all(s is not ExecutionStatus.IN_PROGRESS for s in statuses)

    wait_for(finished, 600, interval=0.1, what=f"{name} to finish")
    with observer.connect() as conn:
        rows = conn.execute(
            select(Activity.execution_id, Activity.step_index, Activity.started_at, Activity.completed_at).where(
                Activity.execution_id.in_(ids)
            )
        ).all()
        unfinished = conn.scalars(
            select(ScheduleExecution.id).where(
                ScheduleExecution.id.in_(ids), ScheduleExecution.status != ExecutionStatus.COMPLETED
            )
        ).all()
    if unfinished:
        raise RuntimeError(f"{name}: executions {list(unfinished)} did not complete")
    return [(e, g, start.timestamp(), end.timestamp()) for e, g, start, end in rows if end is not None]


def chordbeat_runs(bench: Bench) -> list[dict[str, Any]]:
    url = bench.fresh_database()
    settings = bench.settings(url)
    observer = bench.observe(url)
    worker = bench.worker(settings)
    beat = bench.beat(settings)
    results = []
    with running(beat, worker), bench.client(settings) as client:
        bench.wait_for_worker(client)
        _run_chordbeat(bench, client, observer, "warm-up", ALONE)  # pool processes connect and import
        for n in range(bench.runs):
            alone = _run_chordbeat(bench, client, observer, f"alone-{n}", ALONE)
            statements_before, sent_before = _statements(observer, bench.pg.user)
            commands_before, bytes_before = _redis_commands(bench), _redis_bytes(bench)
            with CpuMeter(bench, [worker.pid, beat.pid], observer) as cpu:
                loaded = _run_chordbeat(bench, client, observer, f"loaded-{n}", LOADED)
            statements, sent = _statements(observer, bench.pg.user)
            commands, kept = _redis_commands(bench), _redis_bytes(bench) - bytes_before
            steps = len(loaded)
            results.append(
                {
                    "advance_ms": percentiles(gaps_ms(group_bounds(alone)), "p50", "p95"),
                    "steps_per_s": throughput(loaded),
                    "loaded_advance_ms": percentiles(gaps_ms(group_bounds(loaded)), "p50", "p95"),
                    "worker_rss_mib": rss_mib(worker.pid),
                    "worker_pss_mib": pss_mib(worker.pid),
                    "db_statements_per_step": (statements - statements_before) / steps,
                    "db_round_trips_per_step": (sent - sent_before) / steps,
                    "cpu_ms_per_step": cpu.per_step(steps),
                    "redis_commands_per_step": (commands - commands_before) / steps,
                    "redis_bytes_per_step": kept / steps,
                }
            )
    bench.flush_redis()
    return results


def _run_raw(bench: Bench, shape: tuple[int, ...]) -> Records:
    pipelines, groups, width = shape
    times = bench.redis_client()
    times.delete(raw_app.TIMES_KEY)
    raw_app.app.send_task("raw.launch", args=[pipelines, groups, width], queue=raw_app.QUEUE, ignore_result=True)
    expected = pipelines * groups * width
    wait_for(lambda: times.llen(raw_app.TIMES_KEY) >= expected, 600, interval=0.1, what="raw pipelines to finish")
    return [tuple(json.loads(r)) for r in times.lrange(raw_app.TIMES_KEY, 0, -1)]  # type: ignore[misc]


def _raw_answers() -> bool:
    result = raw_app.app.send_task(raw_app.TICK_TASK, queue=raw_app.QUEUE)
    try:
        return result.get(timeout=5) is None
    finally:
        result.forget()


def raw_runs(bench: Bench) -> list[dict[str, Any]]:
    bench.flush_redis()
    worker = bench.raw_worker()
    results = []
    with running(worker):
        wait_for(_raw_answers, 120, interval=0.2, what="the raw worker")
        _run_raw(bench, ALONE)  # warm-up: pool processes' first tasks connect and import
        for _ in range(bench.runs):
            alone = _run_raw(bench, ALONE)
            bench.redis_client().delete(raw_app.TIMES_KEY)
            bytes_before = _redis_bytes(bench)
            commands_before = _redis_commands(bench)
            with CpuMeter(bench, [worker.pid]) as cpu:
                loaded = _run_raw(bench, LOADED)
            # Less the RPUSH each task spends on recording its own timing (and the list it fills).
            commands = _redis_commands(bench) - len(loaded)
            times = bench.redis_client()
            kept = _redis_bytes(bench) - int(times.memory_usage(raw_app.TIMES_KEY) or 0)
            results.append(
                {
                    "raw_advance_ms": percentiles(gaps_ms(group_bounds(alone)), "p50", "p95"),
                    "raw_steps_per_s": throughput(loaded),
                    "raw_loaded_advance_ms": percentiles(gaps_ms(group_bounds(loaded)), "p50", "p95"),
                    "raw_worker_rss_mib": rss_mib(worker.pid),
                    "raw_worker_pss_mib": pss_mib(worker.pid),
                    "raw_redis_commands_per_step": (commands - commands_before) / len(loaded),
                    "raw_redis_bytes_per_step": (kept - bytes_before) / len(loaded),
                    "raw_cpu_ms_per_step": cpu.per_step(len(loaded)),
                }
            )
    bench.flush_redis()
    return results
