"""What a chaos test does with a cluster, whichever it is (one host, or the multi-host lab): its
knobs, its load, playing the plan, settling, checking, and the report.

Knobs (environment):

- ``CHORDBEAT_CHAOS_SEED``: replay a plan (the seed is printed; plan ``i`` uses seed + i).
- ``CHORDBEAT_CHAOS_SECONDS`` (default 60; a test may default shorter, :func:`plan_seconds`)
  seconds of load and faults per plan;
  ``CHORDBEAT_CHAOS_PLANS`` (default 1) plans per test; ``CHORDBEAT_CHAOS_LONG=1`` means
  300 s, 3 plans and every kind the test can inject.
- ``CHORDBEAT_CHAOS_FAULTS`` / ``CHORDBEAT_CHAOS_EXCLUDE``: comma-separated fault kinds to draw
  from / to leave out (:data:`tests.support.chaos.FAULT_KINDS`, and on the lab :data:`tests.support.chaos.LAB_KINDS`).
- ``CHORDBEAT_CHAOS_SETTLE`` (default 90): seconds the system gets, once schedules are paused,
  to finish every execution; ``CHORDBEAT_CHAOS_BOUND`` (default 120): longest acceptable
  execution.
"""

from __future__ import annotations

import json
import os
import random
import re
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from models import Activity, ActivityStatus, ExecutionStatus, ScheduleExecution, WorkerTask, transaction
from models.session import dispose_all
from tests.support.chaos import Cluster, Fault, harness_client, make_plan, plan_text, pool_processes, running
from tests.support.chaos_invariants import Context, Violation, check_all, measurements, read_step_log, snapshot
from tests.support.chaos_limits import CHAOS_LIMITS, LimitSampler, admissions, check_limits
from tests.support.chaos_tasks import DUMP_STACKS, STEP_TASK
from tests.support.helpers import call, wait_for

LONG = os.environ.get("CHORDBEAT_CHAOS_LONG") == "1"
SECONDS = float(os.environ.get("CHORDBEAT_CHAOS_SECONDS") or (300 if LONG else 60))
PLANS = int(os.environ.get("CHORDBEAT_CHAOS_PLANS") or (3 if LONG else 1))
SETTLE_S = float(os.environ.get("CHORDBEAT_CHAOS_SETTLE") or 90)
EXECUTION_BOUND_S = float(os.environ.get("CHORDBEAT_CHAOS_BOUND") or 120)


def plan_seconds(short: float) -> float:
    """Seconds of load a test's plans last: ``short`` unless a knob says (CHORDBEAT_CHAOS_SECONDS,
    or CHORDBEAT_CHAOS_LONG=1)."""
    return SECONDS if LONG or os.environ.get("CHORDBEAT_CHAOS_SECONDS") else short


#: Seconds per plan beyond load and settling: servers, migrations, process start and stop.
OVERHEAD_S = 90


def fault_kinds(short: tuple[str, ...], every: tuple[str, ...]) -> tuple[str, ...]:
    """The kinds to draw from: the knobs', else ``short`` (``every`` with CHORDBEAT_CHAOS_LONG=1),
    checked against ``every``."""
    chosen = os.environ.get("CHORDBEAT_CHAOS_FAULTS")
    kinds = [k.strip() for k in chosen.split(",")] if chosen else list(every if LONG else short)
    excluded = {k.strip() for k in os.environ.get("CHORDBEAT_CHAOS_EXCLUDE", "").split(",") if k.strip()}
    unknown = (set(kinds) | excluded) - set(every)
    if unknown:
        raise ValueError(f"CHORDBEAT_CHAOS_FAULTS/EXCLUDE: unknown fault kinds {sorted(unknown)}")
    return tuple(k for k in kinds if k not in excluded)


def base_seed() -> int:
    given = os.environ.get("CHORDBEAT_CHAOS_SEED")
    return int(given) if given else random.SystemRandom().randrange(1, 1_000_000)


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
                step("prep", fail_rate=0.05, uses=["chaos-keyed"]),
                [
                    step("fan-a", uses=["chaos-pool"]),
                    step("fan-b", fail_rate=0.05, uses=["chaos-pool"]),
                    step("fan-c", fail_rate=0.3, continue_on_failure=True),
                ],
                step("finish"),
            ],
        },
        {
            # A step timeout that often fires, and a short execution timeout.
            "name": "chaos-timeouts",
            "every": 5,
            "timeout": 12,
            "steps": [step("slow", sleep_max=1.6, timeout=1, uses=["chaos-pool"]), step("after", sleep_max=0.3)],
        },
        {
            "name": "chaos-allow",
            "every": 3,
            "overlap": "allow",
            # Overlapping runs queue for their one slot of the keyed limit, and share the pool.
            "uses": ["chaos-keyed"],
            "steps": [[step("solo", sleep_max=2.5, fail_rate=0.1, uses=["chaos-pool"])]],
        },
        {
            "name": "chaos-buffer",
            "every": 6,
            "overlap": "buffer_one",
            "uses": ["chaos-keyed"],
            "steps": [step("first", sleep_max=3.0), step("second", sleep_max=3.0)],
        },
        {"name": "chaos-cron", "cron": "* * * * *", "steps": [step("tick", sleep_max=0.3)]},
    ]


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


def announced_plan(
    where: str,
    index: int,
    seed: int,
    kinds: tuple[str, ...],
    workers: tuple[str, ...],
    first: str | None = None,
    seconds: float = SECONDS,
) -> list[Fault]:
    """Plan ``index`` of a test (its seed ``seed``, ``seconds`` long), printed with how to replay it."""
    plan = make_plan(seed, seconds, kinds, workers, first)
    print(
        f"\n=== chaos plan {index} {where}: seed {seed}, {seconds:g}s; replay with "
        f"CHORDBEAT_CHAOS_SEED={seed - index} CHORDBEAT_CHAOS_SECONDS={seconds:g} "
        f"CHORDBEAT_CHAOS_FAULTS={','.join(kinds)}\n{plan_text(plan)}",
        flush=True,
    )
    return plan


def play_and_check(
    cluster: Cluster,
    plan: list[Fault],
    log: Path,
    seed: int,
    seconds: float = SECONDS,
    load: tuple[list[dict[str, Any]], list[dict[str, Any]]] | None = None,
    cycles: int = 0,
) -> dict[str, Any]:
    """Start ``cluster``, apply the load (``seconds`` long; ``load``: its limits and schedules, by
    default :data:`CHAOS_LIMITS` and :func:`schedules`; with ``cycles``, it goes on after ``seconds``
    until the limits admitted that many), play ``plan``, settle, and check the
    invariants: the plan's result for the report (its ``violations`` empty when every invariant held)."""
    limits, definitions = load or (CHAOS_LIMITS, schedules(log, seed))
    try:
        with running(cluster), LimitSampler(cluster.database.url) as sampler:
            client = harness_client(cluster.settings)
            try:
                for limit in limits:
                    wait_for(
                        lambda d=limit: call(client, "chordbeat.apply_limit", definition=d),  # type: ignore[misc]
                        60,
                        interval=0.5,
                        what=f"applying limit {limit['name']}",
                    )
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
            if (left := started + seconds - time.time()) > 0:
                time.sleep(left)  # the rest of the load after the last fault
            if cycles:
                # The faults are over: the load goes on until the limits saw ``cycles`` admissions.
                wait_for(lambda: _admitted(cluster, cycles), CYCLES_WAIT_S, interval=1.0, what=f"{cycles} cycles")
            firing_end = time.time()
            settled = settle(cluster, [d["name"] for d in definitions])
            for line in unended_bodies(cluster, log):
                print(line, flush=True)
            sampler.close(time.time())
        ctx = Context(
            snapshot(cluster.database.url),
            read_step_log(log),
            cluster.applied,
            cluster.deaths,
            cluster.exits,
            started=started,
            firing_end=firing_end,
            settled=settled,
            execution_bound_s=EXECUTION_BOUND_S,
            pool_deaths=dict(cluster.pool_deaths),
        )
        limit_violations, limit_stats = check_limits(ctx, sampler.seen, cluster.database.url, limits)
    finally:
        dispose_all()
    violations, slot_stats = check_all(ctx)
    violations += limit_violations
    excerpts = [line for v in violations if v.at is not None for line in log_excerpt(log.parent, v)]
    return {
        "seed": seed,
        "seconds": seconds,
        "faults": [a.as_json() for a in cluster.applied],
        "deaths": {str(pid): at for pid, at in cluster.deaths.items()},
        "pool_deaths": {str(pid): at for pid, at in cluster.pool_deaths.items()},
        "exits": [{"name": x.name, "pid": x.pid, "code": x.code, "at": x.at} for x in cluster.exits],
        "started": started,
        "firing_end": firing_end,
        "fault_count": len(cluster.applied),
        "settle_s": round(settled - firing_end, 1),
        **measurements(ctx),
        **slot_stats,
        **limit_stats,
        "violations": [str(v) for v in violations],
        "violations_by_invariant": dict(_count(violations)),
        "log_excerpts": excerpts,
    }


#: Seconds the load may go on after its plan to reach its cycles.
CYCLES_WAIT_S = 600.0


def _admitted(cluster: Cluster, cycles: int) -> bool:
    try:
        return admissions(cluster.database.url) >= cycles
    except Exception:  # the database restarting
        return False


#: A Celery log line's time: ``[2026-11-28 18:16:12,723: INFO/MainProcess] ...`` (local time).
_LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}):")
#: Seconds of log shown before and after a violation's time, and lines at most per violation.
EXCERPT_S, EXCERPT_LINES = (6.0, 8.0), 60


def log_excerpt(directory: Path, violation: Violation) -> list[str]:
    """The lines of the plan's process logs (beat's, the workers') from just before ``violation``
    to just after it that name its schedule or a fire: what a failure in CI is diagnosed from, the
    temporary directory being gone by then."""
    assert violation.at is not None
    # The processes logged in the local time of the environment they were started with; this
    # process's C library may still hold a zone a test's TZ left behind (strptime re-reads it
    # halfway otherwise, and the window would be hours off).
    time.tzset()
    low, high = violation.at - EXCERPT_S[0], violation.at + EXCERPT_S[1]
    words = ("fire", "retry") + ((violation.schedule,) if violation.schedule else ())
    found: list[tuple[float, str]] = []
    for path in sorted(directory.glob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            match = _LOG_TIME.match(line)
            if match is None or not any(word in line for word in words):
                continue
            at = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if low <= at <= high:
                found.append((at, f"{path.stem}: {line[:300]}"))
    found.sort(key=lambda item: item[0])
    head = f"--- logs around {violation}"
    more = [f"... and {len(found) - EXCERPT_LINES} more lines"] if len(found) > EXCERPT_LINES else []
    return [head, *(line for _, line in found[:EXCERPT_LINES]), *more]


def unended_bodies(cluster: Cluster, log: Path) -> list[str]:
    """For each body that logged a start and no end by now: whether its pool process is alive (then
    its threads' stacks, asked for with DUMP_STACKS) or how it ended, from its worker's log."""
    lines = []
    logs = {pid: cluster.process(name).log for name, pid in cluster.pids().items()}
    for run in read_step_log(log):
        if run.end is not None or run.ppid not in logs:
            continue
        worker_log = logs[run.ppid]
        what = f"body {run.step!r} of execution {run.execution_id} attempt {run.attempt} (pid {run.pid}): no end line"
        # Only a pool process of that worker now: the pid may be another process's since (pids wrap),
        # and the signal's default action ends a process.
        if run.pid not in pool_processes({run.ppid}):
            died = [line for line in worker_log.read_text(errors="replace").splitlines() if f"pid:{run.pid} " in line]
            lines.append(f"{what}; its process is gone: {' | '.join(died[-2:]) or 'no exit in its worker log'}")
            continue
        dump = _stacks(run.pid, worker_log)
        lines.append(f"{what}; its process is alive, its threads now:\n{dump or 'no stacks within 5 s'}")
    return lines


def _stacks(pid: int, worker_log: Path) -> str:
    """What ``pid`` writes to its worker's log once sent DUMP_STACKS: the handler writes every
    thread's stack at once, so the log stops growing when it is done ("": nothing in 5 s, as from
    a process stuck in the kernel, where a signal waits)."""
    before = size = worker_log.stat().st_size
    os.kill(pid, DUMP_STACKS)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        time.sleep(0.1)
        grown = worker_log.stat().st_size
        if size > before and grown == size:
            break
        size = grown
    with worker_log.open("rb") as f:
        f.seek(before)
        return f.read(min(size - before, 6000)).decode(errors="replace")


def _count(violations: list[Violation]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for v in violations:
        counts[v.invariant] = counts.get(v.invariant, 0) + 1
    return counts


def report(title: str, seed: int, results: list[dict[str, Any]], path: Path) -> None:
    """Write the JSON report to ``path``, print the summary line (per fault kind: how many were
    injected, and each one's end to the first step after it) and every violation; fail if any."""
    # Per kind, each fault's end to the first step body starting after it (None: none started).
    first_step_s: dict[str, list[float | None]] = {}
    for r in results:
        for m in r["fault_end_to_first_step_s"]:
            first_step_s.setdefault(m["fault"], []).append(m["first_step_s"])
    recovery = {
        kind: ["none" if took is None else f"{took:.1f}s" for took in times]
        for kind, times in sorted(first_step_s.items())
    }
    data = {
        "seed": seed,
        "plans": len(results),
        "seconds": results[0]["seconds"] if results else SECONDS,
        "faults_injected": sum(r["fault_count"] for r in results),
        "faults_by_kind": {kind: len(times) for kind, times in recovery.items()},
        "first_step_s_by_kind": first_step_s,
        "executions_checked": sum(r["executions"] for r in results),
        "results": results,
    }
    path.write_text(json.dumps(data, indent=2))
    print(
        f"\n=== {title}: seed {seed}, {len(results)} plan(s), {data['faults_injected']} faults, "
        f"{data['executions_checked']} executions checked; fault end -> first step: "
        + ("; ".join(f"{kind} x{len(t)} {', '.join(t)}" for kind, t in sorted(recovery.items())) or "no fault")
        + f"; report: {path}"
    )
    for r in results:
        summary = {
            k: v
            for k, v in r.items()
            if k not in ("violations", "faults", "deaths", "pool_deaths", "exits", "log_excerpts")
        }
        print(json.dumps(summary))
    violations = [f"plan {r['plan']} (seed {r['seed']}): {v}" for r in results for v in r["violations"]]
    for line in violations:
        print(line)
    for r in results:
        for line in r.get("log_excerpts", []):
            print(line)
    shown = "\n".join(violations[:40]) + (f"\n... and {len(violations) - 40} more" if len(violations) > 40 else "")
    assert not violations, f"{len(violations)} invariant violations (CHORDBEAT_CHAOS_SEED={seed}):\n{shown}"
