"""Shared limits: how soon a release starts the next waiter, how many acquire+release cycles a
limit with 10,000 keys held takes a second, and whether a saturated limit slows unrelated starts.

One prefork worker (-c 2) and beat on PostgreSQL, as in the other scenarios. A limit of 1 is held
by a long step (sleeping in one pool process) with ``WAITERS`` runs waiting for it; runs of a
schedule using no limit are started meanwhile, and before it with a long step of the same kind
that uses no limit (so the worker has the same one pool process free both times). Then the holder
is cancelled and the waiters, each one no-op step, run one after another: each one's release
admits the next. The cycles are measured without a worker: ``CYCLERS`` processes call
:mod:`celeryapp.execution.limit_slots` directly, one transaction to acquire and one to release, as
``tests/test_limit_slots.py`` does, beside ``HELD_KEYS`` holders of distinct keys.
"""

from __future__ import annotations

import multiprocessing
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from sqlalchemy import Engine, func, select

from bench.harness import Bench, poll, running, trigger
from bench.stats import percentiles
from celeryapp.client import ChordbeatClient
from celeryapp.domain.shared_limits import parse_limit
from celeryapp.execution.limit_slots import Demand, Holder, acquire_or_wait, release
from celeryapp.execution.limit_store import put_limit
from models import Activity, ExecutionStatus, ScheduleExecution, transaction
from tests.support.servers import wait_for

GATE = "bench-gate"
#: Runs waiting for the gate while it is held: their releases, one after another, are the samples.
WAITERS = 200
#: Starts of the unrelated schedule measured with the gate idle, and again with it saturated.
STARTS = 20
#: Longer than a phase lasts: the long steps are cancelled when the phase ends.
LONG_S = 600
NOOP = {"task": "chordbeat.examples.sleep", "kwargs": {"seconds": 0}}
LONG = {"task": "chordbeat.examples.sleep", "kwargs": {"seconds": LONG_S}}

KEYED = "bench-customers"
#: Distinct keys held while the cycles run; with the cyclers' own, 10,000 keys are live, and the
#: limit has the most slots a limit may have (10,000).
CYCLERS = 2
HELD_KEYS = 10_000 - CYCLERS
HOLDS_PER_TRANSACTION = 500
CYCLE_S = 10.0
#: Holders' worker task ids: far from any real worker task (the holds have no foreign key).
HELD_BASE = 10_000_000


def runs(bench: Bench, redis_db: int = 3) -> list[dict[str, Any]]:
    results = _through_worker(bench, redis_db)
    for run, cycles in zip(results, _cycles(bench), strict=True):
        run["limit_cycles_per_s"] = cycles
    return results


# -- through a worker: admission latency and unrelated starts ------------------------------------


def _through_worker(bench: Bench, redis_db: int) -> list[dict[str, Any]]:
    url = bench.fresh_database()
    settings = bench.settings(url, redis_db)
    observer = bench.observe(url)
    results: list[dict[str, Any]] = []
    with running(bench.beat(settings, "limits-beat"), bench.worker(settings, "limits")), bench.client(settings) as c:
        bench.wait_for_worker(c)
        c.apply_limit({"name": GATE, "slots": 1}, actor="bench")
        define = [
            ("free", [[{"name": "free", **NOOP}]]),
            ("busy", [[{"name": "busy", **LONG}]]),
            ("hold", [[{"name": "hold", **LONG, "uses": [GATE]}]]),
            ("wait", [[{"name": "wait", **NOOP, "uses": [GATE]}]]),
        ]
        for name, steps in define:
            c.apply_schedule({"name": name, "every": 86400, "overlap": "allow", "steps": steps})
        _start(c, observer, "free")  # warm-up: pool processes connect and import
        for _ in range(bench.runs):
            busy = _long_step(c, observer, "busy")
            idle = [_start(c, observer, "free") for _ in range(STARTS)]
            _end(c, observer, busy)
            hold = _long_step(c, observer, "hold")
            waiters = [trigger(c, "wait") for _ in range(WAITERS)]
            poll(lambda: c.get_limit(GATE)["waiting"] >= WAITERS or None, 60, "the waiters", interval=0.2)
            saturated = [_start(c, observer, "free") for _ in range(STARTS)]
            _end(c, observer, hold)
            wait_for(partial(_ended, observer, waiters), 300, interval=0.2, what="the waiters to run")
            idle_ms, saturated_ms = statistics.median(idle), statistics.median(saturated)
            results.append(
                {
                    "limit_admit_ms": percentiles(_admit_gaps_ms(observer, waiters), "p50", "p99"),
                    "limit_unrelated_start_ms": {"idle": idle_ms, "saturated": saturated_ms},
                    "limit_unrelated_start_ratio": saturated_ms / idle_ms,
                }
            )
    bench.flush_redis(redis_db)
    return results


def _first_step(observer: Engine, execution_id: int) -> float | None:
    """Trigger → the run's first step started (ms); None while no step has started."""
    with observer.connect() as conn:
        row = conn.execute(
            select(ScheduleExecution.started_at, Activity.started_at)
            .join(Activity, Activity.execution_id == ScheduleExecution.id)
            .where(ScheduleExecution.id == execution_id)
            .order_by(Activity.started_at)
            .limit(1)
        ).first()
    return None if row is None else (row[1] - row[0]).total_seconds() * 1000


def _start(client: ChordbeatClient, observer: Engine, name: str) -> float:
    """Trigger → first step started of one run of ``name`` (ms), once the run has ended."""
    execution_id = trigger(client, name)
    wait_for(lambda: _ended(observer, [execution_id]), 60, interval=0.02, what=f"{name} to run")
    started = _first_step(observer, execution_id)
    if started is None:
        raise RuntimeError(f"{name}: execution {execution_id} ended without starting a step")
    return started


def _long_step(client: ChordbeatClient, observer: Engine, name: str) -> int:
    """A run of ``name`` whose (long) step has started: it occupies one pool process."""
    execution_id = trigger(client, name)
    poll(lambda: _first_step(observer, execution_id), 60, f"{name}'s step to start", interval=0.05)
    return execution_id


def _end(client: ChordbeatClient, observer: Engine, execution_id: int) -> None:
    client.cancel_execution(execution_id, actor="bench", reason="the phase is measured")
    wait_for(lambda: _ended(observer, [execution_id]), 60, interval=0.1, what="a cancelled run to end")
    # The step stops through the cancel flag: its pool process is free again once it has recorded so.
    wait_for(lambda: _steps_ended(observer, execution_id), 60, interval=0.1, what="a cancelled step to stop")


def _steps_ended(observer: Engine, execution_id: int) -> bool:
    with observer.connect() as conn:
        going = conn.scalar(
            select(func.count())
            .select_from(Activity)
            .where(Activity.execution_id == execution_id, Activity.completed_at.is_(None))
        )
    return not going


def _ended(observer: Engine, ids: list[int]) -> bool:
    with observer.connect() as conn:
        going = conn.scalar(
            select(func.count())
            .select_from(ScheduleExecution)
            .where(ScheduleExecution.id.in_(ids), ScheduleExecution.status == ExecutionStatus.IN_PROGRESS)
        )
    return not going


def _admit_gaps_ms(observer: Engine, ids: list[int]) -> list[float]:
    """One waiter's step ended (its release) → the next waiter's step started, in the order they ran.

    The first waiter is left out: the cancel of the holder's run admitted it, not a step's release.
    """
    with observer.connect() as conn:
        rows = conn.execute(
            select(Activity.started_at, Activity.completed_at)
            .where(Activity.execution_id.in_(ids))
            .order_by(Activity.started_at)
        ).all()
    ends = [completed for _, completed in rows if completed is not None]
    if len(rows) != len(ids) or len(ends) != len(rows):
        raise RuntimeError(f"{len(ids)} waiters, {len(rows)} steps run, {len(ends)} ended: some did not run or end")
    starts = [started for started, _ in rows]
    return [(started - ended).total_seconds() * 1000 for ended, started in zip(ends, starts[1:], strict=False)]


# -- directly: acquire+release cycles beside 10,000 keys ---------------------------------------------


def _cycles(bench: Bench) -> list[float]:
    url = bench.fresh_database()
    with transaction(url) as session:
        put_limit(
            session, parse_limit({"name": KEYED, "slots": 10_000, "key": "{payload.customer}", "per_key_slots": 1})
        )
    for first in range(0, HELD_KEYS, HOLDS_PER_TRANSACTION):
        with transaction(url) as session:
            for n in range(first, min(first + HOLDS_PER_TRANSACTION, HELD_KEYS)):
                held, _ = acquire_or_wait(session, [Demand(KEYED, f"held-{n}")], _holder(HELD_BASE + n))
                if not held:
                    raise RuntimeError(f"holder {n} of {HELD_KEYS} was not admitted")
    context = multiprocessing.get_context("spawn")
    per_run = []
    for run in range(bench.runs):
        # Every cycler imports and connects first; the barrier starts their clocks together.
        ready, counts = context.Barrier(CYCLERS), context.SimpleQueue()
        cyclers = [context.Process(target=_cycle, args=(url, run * CYCLERS + n, ready, counts)) for n in range(CYCLERS)]
        for cycler in cyclers:
            cycler.start()
        for cycler in cyclers:
            cycler.join(CYCLE_S + 120)
        if any(cycler.exitcode != 0 for cycler in cyclers):
            raise RuntimeError(f"a cycler failed: exit codes {[cycler.exitcode for cycler in cyclers]}")
        per_run.append(sum(counts.get() for _ in cyclers) / CYCLE_S)
    return per_run


def _holder(worker_task_id: int) -> Holder:
    return Holder(worker_task_id, 1, execution_id=worker_task_id, step_name="bench")


def _cycle(url: str, cycler: int, ready: Any, counts: Any) -> None:
    """Acquire and release keys no one else uses for ``CYCLE_S`` once every cycler is ready: the
    number of cycles goes to ``counts``."""
    one = _one_cycle(url, HELD_BASE * (cycler + 2), f"cycler-{cycler}")
    one(0)  # connected before the clock starts
    ready.wait()
    done, deadline = 0, time.monotonic() + CYCLE_S
    while time.monotonic() < deadline:
        done += 1
        one(done)
    counts.put(done)


def _one_cycle(url: str, base: int, prefix: str) -> Callable[[int], None]:
    def cycle(n: int) -> None:
        holder = _holder(base + n)
        with transaction(url) as session:
            held, _ = acquire_or_wait(session, [Demand(KEYED, f"{prefix}-{n}")], holder)
        if not held:
            raise RuntimeError(f"{prefix}: key {n} was not admitted at once")
        with transaction(url) as session:
            if release(session, holder.worker_task_id, holder.attempt).slots != 1:
                raise RuntimeError(f"{prefix}: key {n}'s release gave back no slot")

    return cycle
