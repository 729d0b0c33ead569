"""Thousands of schedules: fire lateness and beat CPU when staggered, time to fire when due at once.

chordbeat's schedules are stored as the API stores them, all in one transaction, then
their interval anchors are set so that each one's first slot falls where the scenario wants it,
and their RedBeat entries written (``sync_schedules``) before beat starts. Each schedule has one
no-op step; a prefork worker (-c 2) runs fires and steps while beat is measured.

Raw RedBeat gets the same number of plain entries (``celery.schedules.schedule(60)``) sending a
no-op task nobody consumes: what is measured is beat publishing them.
"""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from celery.schedules import schedule as every
from redbeat.schedulers import RedBeatSchedulerEntry
from redbeat.schedulers import get_redis as redbeat_client
from sqlalchemy import Engine, func, select, text

from bench import raw_app
from bench.harness import Bench, cpu_seconds, poll
from bench.stats import percentiles
from celeryapp import app
from celeryapp.domain.validation import parse_definitions
from celeryapp.scheduling.beat_entries import sync_schedules
from celeryapp.scheduling.store import upsert_schedule
from models import Schedule, ScheduleExecution, ScheduleSource, SlotRecord, transaction, utcnow
from models.audit import BEAT
from models.versions import VersionOrigin

NOOP = {"name": "noop", "task": "chordbeat.examples.sleep", "kwargs": {"seconds": 0}}
#: Staggered schedules' first slots spread over one period.
PERIOD_S = 60
#: Observation of a staggered minute starts this long after its first slot (beat's start settles).
WARMUP_S = 5
#: Consecutive windows of that minute, each one run (a minute holds three after the warm-up).
MAX_WINDOWS = 3
WINDOW_S = (PERIOD_S - 2 * WARMUP_S) / MAX_WINDOWS
#: A slot not fired this long after the observation ended counts as this late (a lower bound).
DRAIN_S = 60
#: A burst not worked off in this long is reported as this long.
BURST_LIMIT_S = 300.0
#: Seconds to set up per schedule, beyond a fixed margin, before the first slot: insert, entries,
#: beat's start-up reconcile (10,000 took 11 s on 2 cores shared with other work).
SETUP_MARGIN_S = 15.0
SETUP_PER_SCHEDULE_S = 0.0015
#: Raw RedBeat's entries are written (one round trip each) after their first slot is chosen.
RAW_SETUP_S = 20.0


def schedule_count(bench: Bench) -> int:
    return 1000 if bench.quick else 10_000


def _create_schedules(bench: Bench, url: str, count: int, offsets_ms: list[float]) -> datetime:
    """``count`` schedules ``every: 60`` whose first slots are ``first + offsets_ms``; returns ``first``."""
    app.apply_settings(bench.settings(url))
    definitions = parse_definitions(
        [{"name": f"s{i:05d}", "every": PERIOD_S, "overlap": "allow", "steps": [[NOOP]]} for i in range(count)]
    )
    with transaction(url) as session:
        now = utcnow()
        for definition in definitions:
            upsert_schedule(session, definition, source=ScheduleSource.API, now=now, origin=VersionOrigin.of(BEAT))
    seconds = SETUP_MARGIN_S + SETUP_PER_SCHEDULE_S * count
    first = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=round(seconds))
    with bench.engine(url).begin() as conn:
        ids = list(conn.scalars(select(Schedule.id).order_by(Schedule.id)))
        conn.execute(
            text("UPDATE schedules SET updated_at = :at, next_run_at = :at WHERE id = :id"),
            [{"id": i, "at": first + timedelta(milliseconds=o)} for i, o in zip(ids, offsets_ms, strict=True)],
        )
    sync_schedules(app, [d.name for d in definitions])
    left = first.timestamp() - time.time()
    print(f"bench: {count} schedules set up, {left:.0f} s before the first slot", file=sys.stderr, flush=True)
    return first


def _create_raw_entries(count: int, due_s: list[float]) -> None:
    """Plain RedBeat entries, each first due at ``due_s[i]`` (a UNIX time in whole seconds).

    RedBeat 2.4 scores an entry whose last run is less than one interval ago too early (it counts
    the interval from now, not from the last run), so beat would reload it every tick until it is
    due. After an entry's first run its score is right; so it is set here as it would be then.
    """
    scores = {}
    for i in range(count):
        entry = RedBeatSchedulerEntry(
            name=f"raw-{i:05d}",
            task=raw_app.TICK_TASK,
            schedule=every(PERIOD_S),
            options={"queue": raw_app.QUEUE, "ignore_result": True},
            last_run_at=datetime.fromtimestamp(due_s[i] - PERIOD_S, UTC),
            app=raw_app.app,
        ).save()
        scores[entry.key] = due_s[i]
    redbeat_client(raw_app.app).zadd(raw_app.app.redbeat_conf.schedule_key, scores)
    if time.time() > min(due_s) - RAW_SETUP_S / 2:
        raise RuntimeError("raw entries took too long to write: raise RAW_SETUP_S")


def _beat_ready(bench: Bench, first: datetime, started: float) -> float:
    """Wait for the first tick of a beat started at ``started``; when it came."""
    ready = poll(lambda: time.time() if bench.beat_ticked_since(started) else None, 300, "beat's first tick")
    lead = first.timestamp() - ready
    print(f"bench: beat ready {lead:.0f} s before the first slot", file=sys.stderr, flush=True)
    return ready


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


def _slots(observer: Engine, start: datetime, end: datetime, expected: int, deadline: float) -> tuple[list[float], int]:
    """Lateness (ms) of the slots due in [start, end), and how many of them started a run.

    A slot's lateness is its execution's creation - the slot; a slot that started nothing (taken
    after the next slot was due: superseded) counts from when it was recorded; one not processed
    by ``deadline`` counts as late as that.
    """
    made = func.coalesce(ScheduleExecution.started_at, SlotRecord.recorded_at)
    query = (
        select(func.extract("epoch", made - SlotRecord.nominal_at) * 1000, SlotRecord.execution_id.is_not(None))
        .outerjoin(ScheduleExecution, ScheduleExecution.id == SlotRecord.execution_id)
        .where(SlotRecord.nominal_at >= start, SlotRecord.nominal_at < end)
    )
    with observer.connect() as conn:
        rows = conn.execute(query).all()
        while len(rows) < expected and time.time() < deadline:
            time.sleep(0.5)
            conn.commit()
            rows = conn.execute(query).all()
    late = [float(r[0]) for r in rows]
    late += [(deadline - end.timestamp()) * 1000] * max(0, expected - len(rows))
    return late, sum(1 for r in rows if r[1])


def _first_slots_between(observer: Engine, start: datetime, end: datetime) -> int:
    with observer.connect() as conn:
        anchored = Schedule.updated_at
        return int(conn.scalar(select(func.count()).where((anchored >= start) & (anchored < end))) or 0)


def _used_memory(bench: Bench) -> int:
    return int(bench.redis_client().info("memory")["used_memory"])


def staggered(bench: Bench) -> list[dict[str, Any]]:
    """10,000 schedules staggered over a minute: lateness and beat CPU in consecutive windows."""
    count = schedule_count(bench)
    windows, window_s = min(bench.runs, MAX_WINDOWS), WINDOW_S
    bench.flush_redis()
    url = bench.fresh_database()
    settings = bench.settings(url)
    empty = _used_memory(bench)
    first = _create_schedules(bench, url, count, [i * PERIOD_S * 1000 / count for i in range(count)])
    entry_bytes = (_used_memory(bench) - empty) / count
    start = first.timestamp() + WARMUP_S
    worker = bench.worker(settings)
    started = time.time()
    beat = bench.beat(settings)
    try:
        beat_ready = _beat_ready(bench, first, started)
        shares = _cpu_windows(beat.pid, start, window_s, windows)
        results = []
        for n in range(windows):
            lo = first + timedelta(seconds=WARMUP_S + n * window_s)
            hi = lo + timedelta(seconds=window_s)
            observer = bench.observe(url)
            expected = _first_slots_between(observer, lo, hi)
            late, fired = _slots(observer, lo, hi, expected, hi.timestamp() + DRAIN_S)
            results.append(
                {
                    "fire_lateness_ms": percentiles(late, "p50", "p99"),
                    "staggered_fired_pct": 100 * fired / max(expected, 1),
                    "beat_cpu_pct": shares[n],
                    "redis_bytes_per_schedule": entry_bytes,
                }
            )
    finally:
        beat.kill()
        worker.kill()
    if beat_ready > start:
        raise RuntimeError(f"beat took {beat_ready - first.timestamp():.1f} s past the first slot to start")
    bench.flush_redis()
    return results


def raw_staggered(bench: Bench) -> list[dict[str, Any]]:
    """Raw RedBeat with as many entries, due in whole seconds spread over a minute: beat CPU."""
    count = schedule_count(bench)
    windows, window_s = min(bench.runs, MAX_WINDOWS), WINDOW_S
    bench.flush_redis()
    first = float(int(time.time()) + round(RAW_SETUP_S))
    _create_raw_entries(count, [first + i % PERIOD_S for i in range(count)])
    beat = bench.raw_beat()
    try:
        shares = _cpu_windows(beat.pid, first + WARMUP_S, window_s, windows)
    finally:
        beat.kill()
    bench.flush_redis()
    return [{"raw_beat_cpu_pct": share} for share in shares]


def burst(bench: Bench) -> dict[str, Any]:
    """Every schedule due in the same second → every slot processed: the last execution created, or
    the slot recorded as superseded (the next slot came first), which ``burst_fired_pct`` counts."""
    count = schedule_count(bench)
    bench.flush_redis()
    url = bench.fresh_database()
    settings = bench.settings(url)
    first = _create_schedules(bench, url, count, [0.0] * count)
    worker = bench.worker(settings)
    started = time.time()
    beat = bench.beat(settings)
    observer = bench.observe(url)
    try:
        late_start = _beat_ready(bench, first, started) > first.timestamp()
        late, fired = _slots(observer, first, first + timedelta(seconds=1), count, time.time() + BURST_LIMIT_S)
    finally:
        beat.kill()
        worker.kill()
    if late_start:
        raise RuntimeError("beat started after the burst's slot: raise SETUP_PER_SCHEDULE_S")
    bench.flush_redis()
    return {"burst_fire_s": max(late) / 1000, "burst_fired_pct": 100 * fired / count}


def raw_burst(bench: Bench) -> dict[str, Any]:
    """As many plain RedBeat entries due in the same second → the last message published."""
    count = schedule_count(bench)
    bench.flush_redis()
    first = float(int(time.time()) + round(RAW_SETUP_S))
    _create_raw_entries(count, [first] * count)
    beat = bench.raw_beat()
    queue = bench.redis_client()
    try:
        done = poll(lambda: time.time() if queue.llen(raw_app.QUEUE) >= count else None, 600, "raw beat", 0.05)
    finally:
        beat.kill()
    bench.flush_redis()
    return {"raw_burst_fire_s": done - first}


def burst_runs(bench: Bench) -> list[dict[str, Any]]:
    return [{**burst(bench), **raw_burst(bench)} for _ in range(bench.runs)]
