"""Recovery times with the default settings: a SIGKILLed worker's step, a SIGKILLed beat's slots.

Each run kills the process doing the work and starts a replacement with another name (another
host), as a supervisor would; the clock runs from the SIGKILL.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from functools import partial

from sqlalchemy import Engine, func, select

from bench.harness import Bench, poll, running, trigger
from celeryapp.recovery.heartbeat_trust import HEARTBEAT_GRACE_KEY, RECOVERY_SEEN_KEY
from models import Activity, ScheduleExecution
from tests.support.processes import Process

#: Long enough to be killed mid-step and still be running when re-queued.
LONG_STEP = {"name": "long", "task": "chordbeat.examples.sleep", "kwargs": {"seconds": 120}}
NOOP = {"name": "noop", "task": "chordbeat.examples.sleep", "kwargs": {"seconds": 0}}


def _attempt_started(observer: Engine, execution_id: int, attempt: int) -> float | None:
    with observer.connect() as conn:
        started = conn.scalar(
            select(Activity.started_at).where(Activity.execution_id == execution_id, Activity.attempt == attempt)
        )
    return started.timestamp() if started else None


def _running_on(observer: Engine, execution_id: int) -> str | None:
    """The node (``name@host``) running the execution's first attempt, once it runs."""
    with observer.connect() as conn:
        return conn.scalar(select(Activity.worker).where(Activity.execution_id == execution_id, Activity.attempt == 1))


def runs(bench: Bench) -> list[dict[str, float]]:
    """Requeue and failover side by side (each on its own Redis database): both mostly wait."""
    with ThreadPoolExecutor(2) as pool:
        failover = pool.submit(failover_runs, bench, 1)
        requeued = requeue_runs(bench)
        return [{**r, **f} for r, f in zip(requeued, failover.result(), strict=True)]


def requeue_runs(bench: Bench, redis_db: int = 0) -> list[dict[str, float]]:
    """SIGKILL of the worker running a step, another worker alive → the step running again.

    Default heartbeat TTL and recovery interval. The killed worker is replaced (another name)
    once the step runs again, so each run starts with two workers.
    """
    url = bench.fresh_database()
    settings = bench.settings(url, redis_db)
    observer = bench.observe(url)
    results = []
    workers = {name: bench.worker(settings, name) for name in ("a0", "b0")}
    with running(bench.beat(settings)), bench.client(settings) as client:
        bench.wait_for_worker(client)
        client.apply_schedule({"name": "long", "every": 86400, "overlap": "allow", "steps": [[LONG_STEP]]})
        # Steady state first: recovery's first pass distrusts missing heartbeats for one TTL.
        redis = bench.redis_client(redis_db)
        poll(
            lambda: (redis.exists(RECOVERY_SEEN_KEY) and not redis.exists(HEARTBEAT_GRACE_KEY)) or None,
            120,
            "recovery to trust heartbeats",
        )
        for n in range(bench.runs):
            execution = trigger(client, "long")
            node = poll(partial(_running_on, observer, execution), 60, "the step to start")
            victim = node.split("@", 1)[0]
            workers.pop(victim).kill()
            killed = time.time()
            restarted = poll(partial(_attempt_started, observer, execution, 2), 120, "the re-queued step")
            results.append({"requeue_s": restarted - killed})
            client.cancel_execution(execution)
            replacement = f"{victim[0]}{n + 1}"
            workers[replacement] = bench.worker(settings, replacement)
        for worker in workers.values():
            worker.stop()
    bench.flush_redis(redis_db)
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


def failover_runs(bench: Bench, redis_db: int = 0) -> list[dict[str, float]]:
    """SIGKILL of the beat holding RedBeat's lock → the next slot fired by the standby."""
    url = bench.fresh_database()
    settings = bench.settings(url, redis_db)
    observer = bench.observe(url)
    results = []
    with running(bench.worker(settings)), bench.client(settings) as client:
        bench.wait_for_worker(client)
        client.apply_schedule({"name": "tick", "every": 1, "overlap": "allow", "steps": [[NOOP]]})
        holder = bench.beat(settings, "beat-0", level="INFO")
        poll(lambda: _fired_after(observer, time.time() - 2), 120, "the first beat to fire")
        for n in range(bench.runs):
            standby = bench.beat(settings, f"beat-{n + 1}", level="INFO")
            poll(partial(_started, standby), 60, "the standby beat to start")
            holder.kill()
            killed = time.time()
            fired = poll(partial(_fired_after, observer, killed), 120, "the standby to fire")
            results.append({"failover_s": fired - killed})
            holder = standby
        holder.stop()
    bench.flush_redis(redis_db)
    return results
