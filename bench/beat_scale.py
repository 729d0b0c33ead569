"""Thousands of schedules: fire lateness and beat CPU when staggered, time to fire when due at once.

chordbeat's schedules are created as a schedule file would create them (one transaction), then
their interval anchors are set so that each one's first slot falls where the scenario wants it,
and their RedBeat entries written (``sync_schedules``) before beat starts. Each schedule has one
no-op step; a prefork worker (-c 2) runs fires and steps while beat is measured.

Raw RedBeat gets the same number of plain entries (``celery.schedules.schedule(60)``) sending a
no-op task nobody consumes: what is measured is beat publishing them.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from celery.schedules import schedule as every
from redbeat.schedulers import RedBeatSchedulerEntry
from sqlalchemy import Engine, func, select, text

from bench import raw_app
from bench.harness import Bench, cpu_seconds
from bench.stats import percentiles
from celeryapp import app
from celeryapp.beat_entries import sync_schedules
from celeryapp.definition import parse_definitions
from celeryapp.schedule_file import apply_definitions
from models import Schedule, ScheduleExecution, transaction
from tests.servers import wait_for

NOOP = {"name": "noop", "task": "chordbeat.examples.sleep", "kwargs": {"seconds": 0}}
#: Staggered schedules' first slots spread over one period.
PERIOD_S = 60
#: Observation of a staggered minute starts this long after its first slot (beat's start settles).
WARMUP_S = 5
#: A slot not fired this long after the observation ended counts as this late (a lower bound).
DRAIN_S = 60
#: Seconds to set up per schedule, beyond a fixed margin, before the first slot: insert, entries,
#: beat's start-up reconcile (measured ≈ 2.5 ms per schedule on 2 busy cores).
SETUP_MARGIN_S = 20.0
SETUP_PER_SCHEDULE_S = 0.004


def schedule_count(bench: Bench) -> int:
    return 1000 if bench.quick else 10_000


def _create_schedules(bench: Bench, url: str, count: int, offsets_ms: list[float]) -> datetime:
    """``count`` schedules ``every: 60`` whose first slots are ``first + offsets_ms``; returns ``first``."""
    app.apply_settings(bench.settings(url))
    definitions = parse_definitions(
        [{"name": f"s{i:05d}", "every": PERIOD_S, "overlap": "allow", "steps": [[NOOP]]} for i in range(count)]
    )
    with transaction(url) as session:
        apply_definitions(session, definitions)
    seconds = SETUP_MARGIN_S + SETUP_PER_SCHEDULE_S * count
    first = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=round(seconds))
    with bench.engine(url).begin() as conn:
        ids = list(conn.scalars(select(Schedule.id).order_by(Schedule.id)))
        conn.execute(
            text("UPDATE schedules SET updated_at = :at, next_run_at = :at WHERE id = :id"),
            [{"id": i, "at": first + timedelta(milliseconds=o)} for i, o in zip(ids, offsets_ms, strict=True)],
        )
    sync_schedules(app, [d.name for d in definitions])
    return first


def _create_raw_entries(count: int, due_s: list[float]) -> None:
    """Plain RedBeat entries, each first due at ``due_s[i]`` (a UNIX time in whole seconds)."""
    for i in range(count):
        RedBeatSchedulerEntry(
            name=f"raw-{i:05d}",
            task=raw_app.TICK_TASK,
            schedule=every(PERIOD_S),
            options={"queue": raw_app.QUEUE, "ignore_result": True},
            last_run_at=datetime.fromtimestamp(due_s[i] - PERIOD_S, UTC),
            app=raw_app.app,
        ).save()


def _wait_until(moment: float) -> None:
    """Sleep until a wall-clock moment: the scenario's own timetable, not a synchronisation."""
    time.sleep(max(0.0, moment - time.time()))


def _cpu_windows(pid: int, start: float, window_s: float, windows: int) -> list[float]:
    """Percent of one core the process used in each of ``windows`` consecutive windows from ``start``."""
    _wait_until(start)
    shares = []
    used = cpu_seconds(pid)
    for n in range(windows):
        _wait_until(start + (n + 1) * window_s)
        now_used = cpu_seconds(pid)
        shares.append((now_used - used) / window_s * 100)
        used = now_used
    return shares


def _lateness_ms(observer: Engine, start: datetime, end: datetime, deadline: float) -> list[float]:
    """Execution created - nominal slot for first slots in [start, end); unfired ones as of ``deadline``."""
    anchored = Schedule.updated_at
    late = func.extract("epoch", ScheduleExecution.started_at - anchored) * 1000
    in_window = (anchored >= start) & (anchored < end)
    with observer.connect() as conn:
        expected = conn.scalar(select(func.count()).select_from(Schedule).where(in_window)) or 0

        def fired() -> list[float]:
            rows = conn.execute(
                select(late).join(Schedule, Schedule.id == ScheduleExecution.schedule_id).where(in_window)
            )
            return [float(r[0]) for r in rows]

        values = fired()
        while len(values) < expected and time.time() < deadline:
            time.sleep(0.5)
            conn.commit()
            values = fired()
        if len(values) < expected:
            values += [(deadline - end.timestamp()) * 1000] * (expected - len(values))
    return values


def _used_memory(bench: Bench) -> int:
    return int(bench.redis_client().info("memory")["used_memory"])


def staggered(bench: Bench, windows: int) -> list[dict[str, Any]]:
    """10,000 schedules staggered over a minute: lateness and beat CPU in consecutive windows."""
    count = schedule_count(bench)
    window_s = (PERIOD_S - 2 * WARMUP_S) / windows
    bench.flush_redis()
    url = bench.fresh_database()
    settings = bench.settings(url)
    empty = _used_memory(bench)
    first = _create_schedules(bench, url, count, [i * PERIOD_S * 1000 / count for i in range(count)])
    entry_bytes = (_used_memory(bench) - empty) / count
    start = first.timestamp() + WARMUP_S
    worker = bench.worker(settings)
    beat = bench.beat(settings)
    try:
        beat_ready = wait_for(lambda: bench.beat_ticked_since(0) and time.time(), 300, what="beat's first tick")
        shares = _cpu_windows(beat.pid, start, window_s, windows)
        results = []
        for n in range(windows):
            lo = first + timedelta(seconds=WARMUP_S + n * window_s)
            hi = lo + timedelta(seconds=window_s)
            late = _lateness_ms(bench.observe(url), lo, hi, hi.timestamp() + DRAIN_S)
            results.append(
                {
                    "fire_lateness_ms": percentiles(late, "p50", "p99"),
                    "beat_cpu_pct": shares[n],
                    "redis_bytes_per_schedule": entry_bytes,
                }
            )
    finally:
        beat.kill()
        worker.kill()
    if float(beat_ready) > start:  # type: ignore[arg-type]
        raise RuntimeError(f"beat took {float(beat_ready) - first.timestamp():.1f} s past the first slot to start")  # type: ignore[arg-type]
    bench.flush_redis()
    return results


def raw_staggered(bench: Bench, windows: int) -> list[dict[str, Any]]:
    """Raw RedBeat with as many entries, due in whole seconds spread over a minute: beat CPU."""
    count = schedule_count(bench)
    window_s = (PERIOD_S - 2 * WARMUP_S) / windows
    bench.flush_redis()
    first = float(int(time.time()) + round(SETUP_MARGIN_S))
    _create_raw_entries(count, [first + i % PERIOD_S for i in range(count)])
    beat = bench.raw_beat()
    try:
        shares = _cpu_windows(beat.pid, first + WARMUP_S, window_s, windows)
    finally:
        beat.kill()
    bench.flush_redis()
    return [{"raw_beat_cpu_pct": share} for share in shares]


def burst(bench: Bench) -> dict[str, Any]:
    """Every schedule due in the same second → the moment the last execution exists."""
    count = schedule_count(bench)
    bench.flush_redis()
    url = bench.fresh_database()
    settings = bench.settings(url)
    first = _create_schedules(bench, url, count, [0.0] * count)
    worker = bench.worker(settings)
    beat = bench.beat(settings)
    observer = bench.observe(url)
    try:
        wait_for(lambda: bench.beat_ticked_since(0), 300, what="beat's first tick")
        late_start = time.time() > first.timestamp()

        def created() -> float | None:
            with observer.connect() as conn:
                made, last = conn.execute(select(func.count(), func.max(ScheduleExecution.started_at))).one()
            return last.timestamp() if made >= count else None

        last = wait_for(created, 600, interval=0.5, what=f"{count} executions")
    finally:
        beat.kill()
        worker.kill()
    if late_start:
        raise RuntimeError("beat started after the burst's slot: raise SETUP_PER_SCHEDULE_S")
    bench.flush_redis()
    return {"burst_fire_s": float(last) - first.timestamp()}  # type: ignore[arg-type]


def raw_burst(bench: Bench) -> dict[str, Any]:
    """As many plain RedBeat entries due in the same second → the last message published."""
    count = schedule_count(bench)
    bench.flush_redis()
    first = float(int(time.time()) + round(SETUP_MARGIN_S))
    _create_raw_entries(count, [first] * count)
    beat = bench.raw_beat()
    queue = bench.redis_client()
    try:
        done = wait_for(lambda: queue.llen(raw_app.QUEUE) >= count and time.time(), 600, interval=0.05, what="raw beat")
    finally:
        beat.kill()
    bench.flush_redis()
    return {"raw_burst_fire_s": float(done) - first}  # type: ignore[arg-type]


def burst_runs(bench: Bench) -> list[dict[str, Any]]:
    return [{**burst(bench), **raw_burst(bench)} for _ in range(bench.runs)]
