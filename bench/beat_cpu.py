"""Beat's CPU per fire, in one process: ``python -m bench.beat_cpu [SCHEDULES] [WINDOW_S] [PERIOD_S]``.

SCHEDULES interval entries (default 20,000) every PERIOD_S (default 12: 20,000 of them fire
1,667 slots a second, as 100,000 minutely schedules do) are written straight into a Redis of
its own, first slots spread over a period; beat's scheduler then ticks as ``celery beat`` runs it
(one beat, no lock, no worker: the fire messages stay queued) for WINDOW_S seconds (default 10,
less than a period: no schedule's last fire is still queued when it is due again). Printed: the
process's CPU per fire and per 1,000 fires a second, the commands clients sent Redis per fire
(``INFO commandstats`` counts those a script runs too: ``evalsha`` are the scripts), bytes per
schedule (``used_memory``) and, with ``BENCH_PROFILE=FILE``, a cProfile of the window. The
database is never read (SQLite, empty): what is measured is beat's own work per tick.
"""

from __future__ import annotations

import base64
import cProfile
import json
import os
import pstats
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import redis
from redbeat.schedulers import ensure_conf

from celeryapp import app
from celeryapp.config import Settings
from celeryapp.domain.names import CONTROL_QUEUE
from celeryapp.scheduling.beat import ChordbeatScheduler
from celeryapp.scheduling.beat_entries import EntryFields, desired_entry
from celeryapp.scheduling.stored_entry import meta_json
from models import ScheduleStatus
from models.migrate import upgrade
from tests.support.servers import RedisServer

#: Ticks start this long after the first slot (beat's first tick loads what is due at once).
SETTLE_S = 2.0


def write_entries(client: redis.Redis, count: int, period_s: int, first: datetime) -> float:
    """``count`` entries, first due at ``first`` spread over a period; bytes per schedule."""
    empty = int(client.info("memory")["used_memory"])
    with client.pipeline(transaction=False) as pipe:
        for i in range(count):
            anchor = first + timedelta(milliseconds=i * period_s * 1000 / count)
            fields = EntryFields(f"s{i:06d}", ScheduleStatus.ACTIVE, None, float(period_s), "UTC", anchor, None)
            entry = desired_entry(app, fields, anchor - timedelta(seconds=period_s))
            assert entry is not None
            pipe.hset(entry.key, mapping={"definition": entry.definition_json(), "meta": meta_json(entry.last_run_at)})
            pipe.zadd(app.redbeat_conf.schedule_key, {entry.key: entry.score})
            if len(pipe) >= 2000:
                pipe.execute()
        pipe.execute()
    return (int(client.info("memory")["used_memory"]) - empty) / count


def fires_queued(client: redis.Redis) -> int:
    fires = 0
    for raw in client.lrange(CONTROL_QUEUE, 0, -1):
        _args, kwargs, _embed = json.loads(base64.b64decode(json.loads(raw)["body"]))
        fires += len(kwargs["fires"])
    return fires


def measure(count: int, window_s: float, period_s: int, profile: str | None) -> None:
    server = RedisServer()
    server.start()
    try:
        tmp = tempfile.mkdtemp(prefix="chordbeat-beat-cpu-")
        database = f"sqlite:///{tmp}/chordbeat.db"
        upgrade(database)
        url = server.url
        app.apply_settings(
            Settings(broker_url=url, result_backend=url, redbeat_url=url, database_url=database, health_dir=tmp)
        )
        app.loader.import_default_modules()
        ensure_conf(app)
        client = redis.Redis.from_url(url)
        first = datetime.now(UTC) + timedelta(seconds=3)
        entry_bytes = write_entries(client, count, period_s, first)
        scheduler = ChordbeatScheduler(app=app, lazy=True)
        scheduler.lock_key = None
        time.sleep(max(0.0, first.timestamp() + SETTLE_S - time.time()))  # the scenario's timetable
        client.config_resetstat()
        profiler = cProfile.Profile() if profile else None
        started, cpu = time.monotonic(), time.process_time()
        if profiler:
            profiler.enable()
        while time.monotonic() - started < window_s:
            time.sleep(scheduler.tick())
        if profiler:
            profiler.disable()
        cpu, wall = time.process_time() - cpu, time.monotonic() - started
        stats = client.info("commandstats")
        fires = fires_queued(client)
        rate = fires / wall
        print(f"schedules {count}, every {period_s} s: {entry_bytes:.0f} B of Redis a schedule")
        print(f"{fires} fires in {wall:.1f} s ({rate:.0f}/s); beat CPU {100 * cpu / wall:.1f} % of a core")
        print(f"{1000 * cpu / fires:.3f} ms a fire; {100 * cpu / wall / (rate / 1000):.1f} % per 1,000 fires/s")
        calls = {name.removeprefix("cmdstat_"): int(s["calls"]) for name, s in stats.items()}
        print("Redis commands a fire:", ", ".join(f"{n} {c / fires:.3f}" for n, c in sorted(calls.items())))
        print("load average:", Path("/proc/loadavg").read_text().strip())
        if profiler and profile:
            profiler.dump_stats(profile)
            pstats.Stats(profile).sort_stats("cumulative").print_stats(40)
    finally:
        server.stop()


if __name__ == "__main__":
    arguments = [float(a) for a in sys.argv[1:4]]
    schedules, window, period = (arguments + [20_000, 10, 12][len(arguments) :])[:3]
    measure(int(schedules), window, int(period), os.environ.get("BENCH_PROFILE"))
