"""What a backfill of 1,000 slots costs (``make bench BENCH_ARGS="--only backfill"``).

A schedule (cron every minute, ``overlap: allow``, one no-op step) is backfilled over the 1,000
minutes before now with ``max_concurrent`` 10, on PostgreSQL and on SQLite: the wall time from the
request to the backfill's completion, and the SQL statements chordbeat sent meanwhile, per slot
(an SQLAlchemy listener on chordbeat's engine, as tests/test_step_cost.py counts; the benchmark
polls through an engine of its own). The worker is in the benchmark's process (Celery's test
worker, 12 threads, every queue) so the listener sees its statements.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from celery.contrib.testing.worker import start_worker
from sqlalchemy import create_engine, event, select

from bench.harness import Bench
from celeryapp import app as chordbeat_app
from celeryapp.config import Settings
from celeryapp.interfaces import service
from celeryapp.interfaces.backfill_service import backfill_schedule
from celeryapp.messaging.redis_client import reset_clients
from models import Backfill, BackfillStatus, get_engine
from models.migrate import upgrade
from models.session import dispose_all

#: Slots in the backfill.
SLOTS = 1_000
#: Its runs at a time.
MAX_CONCURRENT = 10
#: Worker threads: room for the backfill's runs and their advancement.
WORKER_THREADS = 12
#: A backfill not done in this long is a failure of the benchmark.
TIMEOUT_S = 900.0


def runs(the_bench: Bench) -> list[dict[str, Any]]:
    results = []
    for number in range(the_bench.runs):
        result: dict[str, Any] = {}
        sqlite = the_bench.tmp / f"backfill-{number}.db"
        for backend, url in (("postgresql", the_bench.fresh_database()), ("sqlite", f"sqlite:///{sqlite}")):
            if backend == "sqlite":
                upgrade(url)
                dispose_all()
            seconds, statements = _one(the_bench, url)
            result[f"backfill_{backend}_s"] = round(seconds, 2)
            result[f"backfill_{backend}_statements_per_slot"] = round(statements / SLOTS, 2)
        results.append(result)
    return results


@contextmanager
def _pointed_at(the_bench: Bench, url: str) -> Iterator[None]:
    """chordbeat's app (and its in-process worker) on this database and the benchmark's Redis."""
    previous = chordbeat_app.settings
    redis = the_bench.redis.url
    settings = Settings(
        broker_url=redis, result_backend=redis, redbeat_url=redis, database_url=url, health_dir=str(the_bench.tmp)
    )
    chordbeat_app.apply_settings(settings)
    reset_clients()
    # Celery keeps its broker pools from the URLs it first used.
    chordbeat_app._pool = None
    chordbeat_app.amqp._producer_pool = None
    chordbeat_app._backend_cache = None
    chordbeat_app.loader.import_default_modules()
    try:
        yield
    finally:
        chordbeat_app.apply_settings(previous)
        dispose_all()


def _one(the_bench: Bench, url: str) -> tuple[float, int]:
    """Seconds from the request to the backfill's completion, and chordbeat's statements meanwhile."""
    name = "backfilled"
    end = datetime.now(UTC).replace(second=0, microsecond=0)
    start = end - timedelta(minutes=SLOTS)
    steps = [{"name": "s", "task": "chordbeat.examples.sleep", "kwargs": {"seconds": 0}}]
    statements = 0

    def count(*_: Any) -> None:
        nonlocal statements
        statements += 1

    with _pointed_at(the_bench, url):
        service.apply_schedule(chordbeat_app, {"name": name, "cron": "* * * * *", "overlap": "allow", "steps": steps})
        watcher = create_engine(url)
        engine = get_engine(url)
        with start_worker(
            chordbeat_app,
            pool="threads",
            concurrency=WORKER_THREADS,
            perform_ping_check=False,
            shutdown_timeout=30,
            loglevel="WARNING",
        ):
            event.listen(engine, "before_cursor_execute", count)
            began = time.monotonic()
            answer = backfill_schedule(
                chordbeat_app, name, start.isoformat(), end.isoformat(), max_concurrent=MAX_CONCURRENT
            )
            assert answer["count"] == SLOTS, answer
            _wait_done(watcher, answer["backfill_id"])
            seconds = time.monotonic() - began
            event.remove(engine, "before_cursor_execute", count)
        watcher.dispose()
    return seconds, statements


def _wait_done(watcher: Any, backfill_id: int) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        with watcher.connect() as conn:
            status = conn.execute(select(Backfill.status).where(Backfill.id == backfill_id)).scalar_one()
        if status is BackfillStatus.COMPLETED or status == BackfillStatus.COMPLETED.value:
            return
        time.sleep(0.05)
    raise TimeoutError(f"backfill {backfill_id} not completed after {TIMEOUT_S:.0f} s")


if __name__ == "__main__":
    from bench.harness import bench

    with bench(1, True) as the_bench:
        print(runs(the_bench))
