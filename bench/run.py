"""Benchmarks: advancement latency, step throughput and worker memory, against raw Celery's numbers.

    make bench            # or: .venv/bin/python -m bench.run [--database postgresql]

Starts its own Redis (and PostgreSQL when asked), a real prefork worker (-c 2) and measures from
the database's activity timestamps. Prints a markdown table; compare with
``shared/notes/raw-celery-baseline.md`` (same machine class, same Celery/kombu/Redis versions).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import create_engine, select, text

from celeryapp.client import ChordbeatClient
from celeryapp.config import Settings
from models import Activity, ExecutionStatus, ScheduleExecution, transaction
from models.migrate import upgrade
from tests.processes import CELERY, settings_env
from tests.servers import PostgresServer, RedisServer, wait_for


@dataclass
class Result:
    scenario: str
    executions: int
    steps: int
    wall_s: float
    steps_per_s: float
    advance_p50_ms: float
    advance_p95_ms: float
    worker_rss_mib: float


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def rss_mib(pid: int) -> float:
    """Resident memory of a process and its children (the pool)."""
    pids = [pid, *map(int, subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split())]
    total_kib = 0
    for p in pids:
        for line in Path(f"/proc/{p}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total_kib += int(line.split()[1])
    return total_kib / 1024


@contextmanager
def worker(settings: Settings, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    argv = [
        CELERY,
        "-A",
        "celeryapp",
        "worker",
        "-P",
        "prefork",
        "-c",
        "2",
        "-l",
        "WARNING",
        "-n",
        "bench@%h",
        "--without-mingle",
        "--without-gossip",
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(argv, env=settings_env(settings), stdout=out, stderr=subprocess.STDOUT)
        try:
            yield process
        finally:
            process.terminate()
            process.wait(60)


def measure(
    settings: Settings, client: ChordbeatClient, pid: int, name: str, groups: int, width: int, executions: int
) -> Result:
    steps = [
        [{"name": f"g{g}s{s}", "task": "chordbeat.examples.sleep", "kwargs": {"seconds": 0}} for s in range(width)]
        for g in range(groups)
    ]
    client.apply_schedule({"name": name, "every": 86400, "overlap": "allow", "steps": steps})
    started = time.monotonic()
    ids = [client.trigger_schedule(name)["execution_id"] for _ in range(executions)]

    def all_done() -> bool:
        with transaction(settings.database_url, read_only=True) as session:
            statuses = session.scalars(select(ScheduleExecution.status).where(ScheduleExecution.id.in_(ids))).all()
        return all(s is not ExecutionStatus.IN_PROGRESS for s in statuses)

    wait_for(all_done, 600, interval=0.1, what=f"{name} to finish")
    wall = time.monotonic() - started
    rss = rss_mib(pid)
    with transaction(settings.database_url, read_only=True) as session:
        rows = session.execute(
            select(Activity.execution_id, Activity.step_index, Activity.started_at, Activity.completed_at).where(
                Activity.execution_id.in_(ids)
            )
        ).all()
        failed = session.scalars(
            select(ScheduleExecution.id).where(
                ScheduleExecution.id.in_(ids), ScheduleExecution.status != ExecutionStatus.COMPLETED
            )
        ).all()
    if failed:
        raise SystemExit(f"{name}: executions {failed} did not complete")
    bounds: dict[tuple[int, int], tuple[float, float]] = {}
    for execution_id, index, start, end in rows:
        lo, hi = bounds.get((execution_id, index), (float("inf"), float("-inf")))
        bounds[(execution_id, index)] = (min(lo, start.timestamp()), max(hi, end.timestamp()))
    advances = [(bounds[(e, g + 1)][0] - bounds[(e, g)][1]) * 1000 for (e, g) in bounds if (e, g + 1) in bounds]
    first = min(b[0] for b in bounds.values())
    last = max(b[1] for b in bounds.values())
    return Result(
        name,
        executions,
        len(rows),
        round(wall, 2),
        round(len(rows) / (last - first), 1),
        round(statistics.median(advances), 1),
        round(percentile(advances, 0.95), 1),
        round(rss, 1),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--database", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--runs", type=int, default=3, help="repetitions; medians are reported")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="chordbeat-bench-"))
    redis_server = RedisServer()
    redis_server.start()
    pg = None
    try:
        if args.database == "postgresql":
            pg = PostgresServer()
            pg.start()
            engine = create_engine(pg.url(), isolation_level="AUTOCOMMIT")
            with engine.connect() as conn:
                conn.execute(text("CREATE DATABASE bench"))
            engine.dispose()
            url = pg.url("bench")
        else:
            url = f"sqlite:///{tmp / 'bench.db'}"
        upgrade(url)
        settings = Settings(
            broker_url=redis_server.url,
            result_backend=redis_server.url,
            redbeat_url=redis_server.url,
            database_url=url,
            health_dir=str(tmp),
        )
        os.environ.update(settings_env(settings))
        with worker(settings, tmp / "worker.log") as process, ChordbeatClient(redis_server.url, timeout_s=60) as client:
            wait_for(lambda: client.list_schedules() is not None, 60, what="the worker")
            runs = [
                [
                    measure(settings, client, process.pid, f"one-pipeline-20x4-{n}", groups=20, width=4, executions=1),
                    measure(settings, client, process.pid, f"one-pipeline-20x1-{n}", groups=20, width=1, executions=1),
                    measure(settings, client, process.pid, f"100-pipelines-5x2-{n}", groups=5, width=2, executions=100),
                ]
                for n in range(args.runs)
            ]
    finally:
        # Pending results' finalizers would otherwise retry against the stopped Redis at exit.
        gc.collect()
        sys.unraisablehook = lambda _unraisable: None
        logging.getLogger("celery.backends.asynchronous").disabled = True
        logging.getLogger("celery.backends.redis").disabled = True
        redis_server.close()
        if pg:
            pg.close()
    if args.json:
        print(json.dumps([[r.__dict__ for r in run] for run in runs], indent=2))
        return
    print(f"\nchordbeat on {args.database}, prefork -c 2, Redis on loopback; median of {args.runs} runs [min-max]\n")
    print("| scenario | executions | steps | steps/s | advance p50 ms | advance p95 ms | worker RSS MiB |")
    print("|---|---|---|---|---|---|---|")
    for column in zip(*runs, strict=True):
        first = column[0]

        def spread(field: str, rows: tuple[Result, ...] = column) -> str:
            values = [getattr(r, field) for r in rows]
            return f"{statistics.median(values):g} [{min(values):g}-{max(values):g}]"

        print(
            f"| {first.scenario.rsplit('-', 1)[0]} | {first.executions} | {first.steps} | {spread('steps_per_s')} | "
            f"{spread('advance_p50_ms')} | {spread('advance_p95_ms')} | {column[-1].worker_rss_mib} |"
        )


if __name__ == "__main__":
    sys.exit(main())
