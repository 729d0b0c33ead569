"""100,000 schedules on one deployment (issue 41): ``bench.run --only scale``, on demand.

Two workloads of ``--scale-schedules`` schedules (default 100,000), each with one no-op step, one
prefork worker (-c 2) on every queue and one beat, PostgreSQL and Redis as in the other scenarios:

- **Staggered**: ``every: 60``, first slots spread over a minute. The schedules are applied as a
  declarative file with ``chordbeat apply`` (timed: the apply figure; the whole file when it fits
  the largest file size limit, ``CHORDBEAT_SCHEDULE_FILE_MAX_BYTES``), then their anchors moved as
  in :mod:`bench.beat_scale` and their entries written again. One window of the minute is observed:
  fire lateness, the share of slots that started a run, beat's CPU. Beat is then stopped and
  started again: the restart is its start → its first tick (lock taken, every entry checked).
- **Daily**: ``cron: 0 0 * * *`` in 20 time zones that are all at UTC+0 in January, so all are due
  at the same instant, the next 15 January 00:00 UTC. That instant is brought near: the deployment's
  reference clock (its Redis's ``TIME``) runs on a Redis started with tests/support/clock_shift.c,
  and beat and the worker run under libfaketime with the same offset (Celery compares some times on
  the local clock). The file is applied under that clock too, so its entries are first due at that
  00:00. Measured: the due instant → the last run started, then → every run's step done (the rows
  and bytes one day of it leaves in the database).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from redis import Redis
from sqlalchemy import Connection, Engine, func, select, text

from bench.beat_scale import (
    PERIOD_S,
    SETUP_MARGIN_S,
    WARMUP_S,
    _cpu_windows,
    _first_slots_between,
    _slots,
    _used_memory,
)
from bench.fire_watch import FireWatch
from bench.harness import Bench, poll
from bench.stats import percentiles
from celeryapp import app
from celeryapp.config import Settings
from celeryapp.scheduling.beat_entries import sync_schedules
from celeryapp.variables import DEFAULT_SCHEDULE_FILE_MAX_BYTES, MAX_SCHEDULE_FILE_MAX_BYTES
from models import Activity, Schedule, ScheduleExecution, SlotRecord
from tests.support.processes import CELERY, clock_shift_library, skewed
from tests.support.servers import RedisServer, wait_for

#: 20 canonical zones at UTC+0 in January: 00:00 in each is the same instant.
ZONES = (
    "UTC",
    "Europe/London",
    "Europe/Dublin",
    "Europe/Lisbon",
    "Europe/Guernsey",
    "Europe/Jersey",
    "Europe/Isle_of_Man",
    "Atlantic/Canary",
    "Atlantic/Faroe",
    "Atlantic/Madeira",
    "Atlantic/Reykjavik",
    "Atlantic/St_Helena",
    "Africa/Abidjan",
    "Africa/Accra",
    "Africa/Dakar",
    "Africa/Bissau",
    "Africa/Monrovia",
    "Africa/Sao_Tome",
    "America/Danmarkshavn",
    "Antarctica/Troll",
)
STEP = "[[{name: noop, task: chordbeat.examples.sleep, kwargs: {seconds: 0}}]]"
#: Beat's start (its full check of every entry) per schedule, beyond SETUP_MARGIN_S: 10,000 took
#: 11 s on 2 shared cores.
BEAT_START_PER_SCHEDULE_S = 0.0015
#: A burst not started in this long, or its steps not done in this long, is reported as this long.
BURST_LIMIT_S = 600.0
STEPS_LIMIT_S = 300.0
#: The whole file is applied with ``chordbeat apply`` when it fits the largest schedule file the
#: setting allows (100,000 schedules are about 12 MB); beyond, as many schedules as fit, the rest
#: copied in SQL and the apply time extrapolated (``scale_apply_measured.whole`` says which).
FILE_LIMIT_BYTES = MAX_SCHEDULE_FILE_MAX_BYTES
#: The tables a run leaves rows in (worker tasks are deleted as their steps end).
HISTORY_TABLES = ("schedule_executions", "activities", "schedule_slots")


def _write_file(path: Path, lines: list[str], source: str) -> int:
    """The file of as many of ``lines`` as fit :data:`FILE_LIMIT_BYTES`; how many it has."""
    head = f"source: {source}\nschedules:\n"
    size, fit = len(head), 0
    for line in lines:
        size += len(line.encode()) + 1
        if size > FILE_LIMIT_BYTES:
            break
        fit += 1
    path.write_text(head + "\n".join(lines[:fit]) + "\n")
    return fit


def _apply(bench: Bench, settings: Settings, path: Path) -> float:
    """``chordbeat apply --yes FILE`` as an operator runs it, its file size limit raised to the
    file's when it is larger than the default; its wall time in seconds."""
    chordbeat = str(Path(CELERY).with_name("chordbeat"))
    limit = max(DEFAULT_SCHEDULE_FILE_MAX_BYTES, path.stat().st_size)
    began = time.monotonic()
    done = subprocess.run(
        [chordbeat, "apply", "--yes", "--json", str(path)],
        env={**bench.env(settings), "CHORDBEAT_SCHEDULE_FILE_MAX_BYTES": str(limit)},
        capture_output=True,
        text=True,
        check=False,
    )
    took = time.monotonic() - began
    if done.returncode != 0:
        raise RuntimeError(f"chordbeat apply {path.name} failed: {done.stderr[-2000:]}")
    print(f"bench: applied {path.name} in {took:.1f} s", file=sys.stderr, flush=True)
    return took


def _columns(conn: Connection, table: str, leave_out: set[str]) -> list[str]:
    query = text("SELECT column_name FROM information_schema.columns WHERE table_name = :t ORDER BY ordinal_position")
    return [c for c in conn.scalars(query, {"t": table}) if c not in leave_out]


def _clone(engine: Engine, prefix: str, applied: int, count: int) -> None:
    """Schedules ``applied`` … ``count - 1`` as copies of the applied ones (number ``g`` of number
    ``g % templates``), rows as the apply writes them: the schedule, its steps, its first version."""
    if count <= applied:
        return
    templates = min(applied, len(ZONES))
    name = "lpad(({})::text, 6, '0')"
    params = {"prefix": prefix, "lo": applied, "hi": count - 1, "k": templates}
    began = time.monotonic()
    with engine.begin() as conn:
        top = int(conn.scalar(text("SELECT max(id) FROM schedules")) or 0)
        cols = _columns(conn, "schedules", {"id", "name"})
        listed = ", ".join(cols)
        conn.execute(
            text(
                f"INSERT INTO schedules ({listed}, name) "
                f"SELECT {', '.join('t.' + c for c in cols)}, :prefix || {name.format('g')} "
                f"FROM generate_series(CAST(:lo AS integer), CAST(:hi AS integer)) AS g "
                f"JOIN schedules AS t ON t.name = :prefix || {name.format('g % :k')}"
            ),
            params,
        )
        template_of = f"t.name = :prefix || {name.format('(substr(n.name, 2)::int % :k)')}"
        cols = _columns(conn, "schedule_steps", {"id", "schedule_id"})
        conn.execute(
            text(
                f"INSERT INTO schedule_steps (schedule_id, {', '.join(cols)}) "
                f"SELECT n.id, {', '.join('st.' + c for c in cols)} FROM schedules AS n "
                f"JOIN schedules AS t ON {template_of} JOIN schedule_steps AS st ON st.schedule_id = t.id "
                "WHERE n.id > :top"
            ),
            {**params, "top": top},
        )
        cols = _columns(conn, "schedule_versions", {"id", "schedule_id", "schedule_name", "definition", "hash"})
        conn.execute(
            text(
                f"INSERT INTO schedule_versions (schedule_id, schedule_name, definition, hash, {', '.join(cols)}) "
                f"SELECT id, name, d, encode(sha256(convert_to(d, 'UTF8')), 'hex'), {', '.join(cols)} FROM ("
                f"SELECT n.id, n.name, {', '.join('v.' + c for c in cols)}, "
                "replace(v.definition, '\"name\":\"' || t.name || '\"', '\"name\":\"' || n.name || '\"') AS d "
                f"FROM schedules AS n JOIN schedules AS t ON {template_of} "
                "JOIN schedule_versions AS v ON v.schedule_id = t.id WHERE n.id > :top) AS copies"
            ),
            {**params, "top": top},
        )
    print(f"bench: {count - applied} schedules copied in {time.monotonic() - began:.1f} s", file=sys.stderr)


def _make_schedules(
    bench: Bench, settings: Settings, count: int, prefix: str, line: Callable[[int], str]
) -> tuple[float, int]:
    """``count`` schedules: as many as fit a file applied as one (its time and how many
    returned), the rest copied."""
    path = bench.tmp / f"{prefix}.yaml"
    applied = _write_file(path, [line(i) for i in range(count)], prefix)
    apply_s = _apply(bench, settings, path)
    _clone(bench.engine(settings.database_url), prefix, applied, count)
    return apply_s, applied


def _bytes_per_run(engine: Engine) -> float:
    """Bytes (with indexes and TOAST) a run leaves in the history tables: one row in each, so each
    table's size per row, summed (the tables were empty before the workload)."""
    total = 0.0
    with engine.connect() as conn:
        for table in HISTORY_TABLES:
            rows = int(conn.scalar(text(f"SELECT count(*) FROM {table}")) or 0)
            size = int(conn.scalar(text("SELECT pg_total_relation_size(:t)"), {"t": table}) or 0)
            total += size / rows if rows else 0.0
    return total


def staggered(bench: Bench, count: int) -> dict[str, Any]:
    load = os.getloadavg()[0]
    bench.flush_redis()
    url = bench.fresh_database()
    settings = bench.settings(url)
    app.apply_settings(settings)
    empty = _used_memory(bench)
    apply_s, applied = _make_schedules(
        bench, settings, count, "s", lambda i: f"- {{name: s{i:06d}, every: {PERIOD_S}, overlap: allow, steps: {STEP}}}"
    )
    entry_bytes = (_used_memory(bench) - empty) / applied
    # Anchors spread over a minute, first slot far enough ahead for beat's start.
    bench.flush_redis()
    lead = SETUP_MARGIN_S + BEAT_START_PER_SCHEDULE_S * count
    first = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=round(lead + 0.0005 * count))
    with bench.engine(url).begin() as conn:
        ids = list(conn.scalars(select(Schedule.id).order_by(Schedule.id)))
        offsets = [timedelta(milliseconds=i * PERIOD_S * 1000 / count) for i in range(count)]
        conn.execute(
            text("UPDATE schedules SET updated_at = :at, next_run_at = :at WHERE id = :id"),
            [{"id": i, "at": first + o} for i, o in zip(ids, offsets, strict=True)],
        )
    sync_schedules(app, [f"s{i:06d}" for i in range(count)])
    window_s = PERIOD_S - 2 * WARMUP_S
    start = first.timestamp() + WARMUP_S
    observer = bench.observe(url)
    worker = bench.worker(settings)
    watch = FireWatch(bench.redis.url)
    watch.start()
    started = time.time()
    beat = bench.beat(settings)
    try:
        ready = poll(lambda: time.time() if bench.beat_ticked_since(started) else None, 600, "beat's first tick")
        if ready > start:
            raise RuntimeError(f"beat was ready {ready - first.timestamp():.0f} s after the first slot: raise the lead")
        profiles = _profiles(bench, {"beat": beat.pid, "worker": worker.pid}, start, window_s)
        [cpu] = _cpu_windows(beat.pid, start, window_s, 1)
        for profile in profiles:
            profile.wait(60)
        lo = first + timedelta(seconds=WARMUP_S)
        hi = lo + timedelta(seconds=window_s)
        expected = _first_slots_between(observer, lo, hi)
        late, fired = _slots(observer, lo, hi, expected, hi.timestamp() + 60)
        watch.stop()
        sent_late = watch.lateness_ms(lo.timestamp(), hi.timestamp())
        beat.stop()
        restarted = time.time()
        beat = bench.beat(settings)
        restart_s = poll(lambda: time.time() if bench.beat_ticked_since(restarted) else None, 600, "beat again")
    finally:
        watch.stop()
        beat.kill()
        worker.kill()
    runs_a_day = count * 86400 / PERIOD_S
    bench.flush_redis()
    return {
        # The whole file's apply when it fit the file size limit, else extrapolated (linear).
        "scale_apply_s": apply_s * count / applied,
        "scale_apply_measured": {"schedules": applied, "s": apply_s, "whole": applied == count},
        "scale_redis_bytes_per_schedule": entry_bytes,
        "scale_fire_lateness_ms": percentiles(late, "p50", "p99"),
        "scale_fired_pct": 100 * fired / max(expected, 1),
        "scale_beat_cpu_pct": cpu,
        "scale_beat_restart_s": restart_s - restarted,
        # A run is a row in each history table (execution, slot record, the step's attempt); its
        # bytes are measured on the daily burst's runs (here few steps ran: their table's pages
        # divided by a few rows would say nothing).
        "scale_staggered_db_rows_per_day": len(HISTORY_TABLES) * runs_a_day,
        "scale_staggered_loadavg": load,
        # Beat's part of the lateness: its fire message in the queue - the slot (bench/fire_watch.py);
        # none seen (0 %): every message was taken within a look of its publishing.
        "scale_beat_send_lateness_ms": percentiles(sent_late or [0.0], "p50", "p99"),
        "scale_beat_send_seen_pct": 100 * len(sent_late) / max(expected, 1),
    }


def _profiles(bench: Bench, pids: dict[str, int], start: float, window_s: float) -> list[subprocess.Popen[bytes]]:
    """With ``BENCH_PROFILE=DIR``: py-spy's collapsed stacks of each process (a worker with its pool)
    over the window, in DIR/<name>.txt (py-spy is not a dependency: ``pip install py-spy``)."""
    where = os.environ.get("BENCH_PROFILE")
    if not where:
        return []
    Path(where).mkdir(parents=True, exist_ok=True)
    time.sleep(max(0.0, start - time.time()))
    record = [str(Path(CELERY).with_name("py-spy")), "record", "--subprocesses", "--format", "raw", "-r", "50"]
    return [
        subprocess.Popen(
            [*record, "-d", str(round(window_s)), "-o", str(Path(where) / f"{name}.txt"), "-p", str(pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, pid in pids.items()
    ]


def _next_common_midnight() -> datetime:
    now = datetime.now(UTC)
    due = datetime(now.year + 1, 1, 15, tzinfo=UTC)
    for zone in ZONES:
        if ZoneInfo(zone).utcoffset(due) != timedelta(0):
            raise RuntimeError(f"{zone} is not at UTC+0 on {due:%Y-%m-%d}")
    return due


class ShiftedRedis(RedisServer):
    """A Redis whose clock (the deployment's reference) is ``shift_s`` ahead."""

    def __init__(self, shift_s: int) -> None:
        super().__init__()
        self.shift_s = shift_s

    def start(self) -> None:
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        env = {"LD_PRELOAD": str(clock_shift_library()), "CHORDBEAT_CLOCK_SHIFT_S": str(self.shift_s)}
        self.proc = subprocess.Popen([*argv, "--dir", str(self.dir)], stdout=subprocess.DEVNULL, env=env)
        wait_for(Redis(port=self.port).ping, 10, what="the shifted redis-server to answer")


def daily(bench: Bench, count: int, apply_s: float) -> dict[str, Any]:
    load = os.getloadavg()[0]
    due = _next_common_midnight()
    # The apply (as long as the staggered one), the copies and beat's start must end before 00:00.
    lead = SETUP_MARGIN_S + 1.5 * apply_s + (BEAT_START_PER_SCHEDULE_S + 0.0005) * count
    shift_s = round(due.timestamp() - lead - time.time())
    redis_server = ShiftedRedis(shift_s)
    redis_server.start()
    try:
        url = bench.fresh_database()
        base = bench.settings(url)
        settings = Settings(
            broker_url=redis_server.url,
            result_backend=redis_server.url,
            redbeat_url=redis_server.url,
            database_url=url,
            health_dir=base.health_dir,
        )
        skew = skewed(shift_s)
        env = {**bench.env(settings), **skew}
        # Applied under the shifted reference (its entries first due at that 00:00); the copies get
        # theirs from beat's start, which checks every schedule.
        _make_schedules(
            bench,
            settings,
            count,
            "d",
            lambda i: f'- {{name: d{i:06d}, cron: "0 0 * * *", timezone: {ZONES[i % len(ZONES)]}, steps: {STEP}}}',
        )
        observer = bench.observe(url)
        worker = bench.worker(settings, env=env)
        started = time.time() + shift_s
        beat = bench.beat(settings, env=env)
        try:
            ready = poll(lambda: time.time() if bench.beat_ticked_since(started) else None, 600, "beat's first tick")
            if ready + shift_s > due.timestamp():
                raise RuntimeError(f"beat was ready {ready + shift_s - due.timestamp():.0f} s after 00:00")
            print(f"bench: beat ready {due.timestamp() - ready - shift_s:.0f} s before 00:00", file=sys.stderr)
            burst_s, fired = _burst(observer, due, count)
            steps_s, steps_ended = _steps_done(observer, due, count)
            run_bytes = _bytes_per_run(observer)
        finally:
            beat.kill()
            worker.kill()
    finally:
        redis_server.close()
    return {
        "scale_burst_start_s": burst_s,
        "scale_burst_fired_pct": 100 * fired / count,
        # The last step's end when all ended, else the latest end when the wait stopped.
        "scale_burst_steps_done_s": steps_s,
        "scale_burst_steps_done_pct": 100 * steps_ended / count,
        "scale_daily_db_rows_per_day": len(HISTORY_TABLES) * count,
        "scale_daily_db_bytes_per_day": run_bytes * count,
        "scale_daily_loadavg": load,
    }


def _burst(observer: Engine, due: datetime, count: int) -> tuple[float, int]:
    """The due instant → every slot processed (the last run started or slot recorded); runs started."""
    made = func.coalesce(ScheduleExecution.started_at, SlotRecord.recorded_at)
    query = (
        select(func.count(), func.count(SlotRecord.execution_id), func.max(func.extract("epoch", made)))
        .outerjoin(ScheduleExecution, ScheduleExecution.id == SlotRecord.execution_id)
        .where(SlotRecord.nominal_at == due)
    )

    def done() -> tuple[float, int] | None:
        with observer.connect() as conn:
            slots, runs, last = conn.execute(query).one()
        return (float(last) - due.timestamp(), int(runs)) if slots >= count else None

    try:
        return poll(done, BURST_LIMIT_S + 300, "the burst's slots", 0.5)
    except AssertionError:
        with observer.connect() as conn:
            _, runs, _ = conn.execute(query).one()
        return BURST_LIMIT_S, int(runs)


def _steps_done(observer: Engine, due: datetime, count: int) -> tuple[float, int]:
    """The due instant → the last of the burst's steps ended (reference time), and how many ended;
    at most :data:`STEPS_LIMIT_S` waited (the bytes a run leaves are then measured on those done)."""
    query = select(func.count(), func.max(func.extract("epoch", Activity.completed_at))).where(
        Activity.completed_at.is_not(None)
    )
    deadline = time.monotonic() + STEPS_LIMIT_S
    while True:
        with observer.connect() as conn:
            ended, last = conn.execute(query).one()
        if ended >= count or time.monotonic() > deadline:
            return (float(last or 0.0) - due.timestamp(), int(ended))
        time.sleep(1.0)


def runs(bench: Bench) -> list[dict[str, Any]]:
    count = bench.scale_schedules
    figures = {"scale_schedules": count, **staggered(bench, count)}
    figures |= daily(bench, count, figures["scale_apply_measured"]["s"])
    runs_a_day = figures["scale_staggered_db_rows_per_day"] / len(HISTORY_TABLES)
    figures["scale_staggered_db_bytes_per_day"] = figures["scale_daily_db_bytes_per_day"] / count * runs_a_day
    return [figures]
