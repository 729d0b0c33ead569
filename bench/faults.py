"""Recovery times with the default settings: a SIGKILLed worker's step, a SIGKILLed beat's slots.

Each run kills the process doing the work and starts a replacement with another name (another
host), as a supervisor would; the clock runs from the SIGKILL.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from sqlalchemy import Engine, func, select

from bench.harness import Bench, running
from models import Activity, ScheduleExecution
from tests.processes import Process
from tests.servers import wait_for

#: Long enough to be killed mid-step and still be running when re-queued.
LONG_STEP = {"name": "long", "task": "chordbeat.examples.sleep", "kwargs": {"seconds": 120}}
NOOP = {"name": "noop", "task": "chordbeat.examples.sleep", "kwargs": {"seconds": 0}}


def _attempt_started(observer: Engine, execution_id: int, attempt: int) -> float | None:
    with observer.connect() as conn:
        started = conn.scalar(
            select(Activity.started_at).where(Activity.execution_id == execution_id, Activity.attempt == attempt)
        )
    return started.timestamp() if started else None


def requeue_runs(bench: Bench) -> list[dict[str, float]]:
    """SIGKILL of the worker running a step → the step running again (default TTL and interval)."""
    url = bench.fresh_database()
    settings = bench.settings(url)
    observer = bench.observe(url)
    results = []
    worker = bench.worker(settings, "victim-0")
    with running(bench.beat(settings)), bench.client() as client:
        bench.wait_for_worker(client)
        client.apply_schedule({"name": "long", "every": 86400, "overlap": "allow", "steps": [[LONG_STEP]]})
        for n in range(bench.runs):
            execution = client.trigger_schedule("long")["execution_id"]
            wait_for(lambda e=execution: _attempt_started(observer, e, 1), 60, what="the step to start")
            worker.kill()
            killed = time.time()
            worker = bench.worker(settings, f"victim-{n + 1}")
            restarted = wait_for(lambda e=execution: _attempt_started(observer, e, 2), 120, what="the re-queued step")
            results.append({"requeue_s": float(restarted) - killed})  # type: ignore[arg-type]
            client.cancel_execution(execution)
        worker.stop()
    bench.flush_redis()
    return results


def _fired_after(observer: Engine, after: float) -> float | None:
    with observer.connect() as conn:
        first = conn.scalar(
            select(func.min(ScheduleExecution.started_at)).where(
                ScheduleExecution.started_at > datetime.fromtimestamp(after, UTC)
            )
        )
    return first.timestamp() if first else None


def _started(process: Process) -> bool:
    return "beat: Starting..." in process.output()


def failover_runs(bench: Bench) -> list[dict[str, float]]:
    """SIGKILL of the beat holding RedBeat's lock → the next slot fired by the standby."""
    url = bench.fresh_database()
    settings = bench.settings(url)
    observer = bench.observe(url)
    results = []
    with running(bench.worker(settings)), bench.client() as client:
        bench.wait_for_worker(client)
        client.apply_schedule({"name": "tick", "every": 1, "overlap": "allow", "steps": [[NOOP]]})
        holder = bench.beat(settings, "beat-0", level="INFO")
        wait_for(lambda: _fired_after(observer, time.time() - 2), 120, what="the first beat to fire")
        for n in range(bench.runs):
            standby = bench.beat(settings, f"beat-{n + 1}", level="INFO")
            wait_for(lambda s=standby: _started(s), 60, what="the standby beat to start")
            holder.kill()
            killed = time.time()
            fired = wait_for(lambda k=killed: _fired_after(observer, k), 120, what="the standby to fire")
            results.append({"failover_s": float(fired) - killed})  # type: ignore[arg-type]
            holder = standby
        holder.stop()
    bench.flush_redis()
    return results
