"""Dashboard page times with 10,000 schedules and 1,000,000 executions (2,000,000 step attempts).

    .venv/bin/python -m bench.web_pages [--database sqlite|postgresql] [--executions N]

Seeds a fresh database in bulk (``INSERT … SELECT`` over a generated series), serves the
dashboard from a thread and times each page over HTTP (median of several requests, logged in as
an admin). Redis answers the health page; no worker runs, so the ping waits its full second.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta

from sqlalchemy import create_engine, insert, text

from celeryapp import app as chordbeat_app
from celeryapp.config import Settings
from models import Schedule, ScheduleStep
from models.migrate import upgrade
from tests.support.servers import PostgresServer, RedisServer
from tests.support.web_server import ADMIN, WebServer

SCHEDULES = 10_000
START = datetime(2026, 1, 1, tzinfo=UTC)


def seed(url: str, executions: int, hot: int = 0) -> None:
    engine = create_engine(url)
    now = datetime.now(UTC)
    with engine.begin() as conn:
        conn.execute(
            insert(Schedule),
            [
                {
                    "name": f"sched-{i:05d}",
                    "source": "api",
                    "status": "paused" if i % 10 == 0 else "active",
                    "enabled": True,
                    "cron": "0 2 * * *" if i % 2 else None,
                    "every_s": None if i % 2 else 3600.0,
                    "timezone": "Europe/London" if i % 2 else "UTC",
                    "overlap": "skip",
                    "max_retries": 0,
                    "retry_delay_s": 60.0,
                    "total_repeats": 0,
                    "payload": {},
                    "run_count": executions // SCHEDULES,
                    "error_count": 0,
                    "current_retry": 0,
                    "next_run_at": now + timedelta(minutes=i % 1440),
                    "buffered": False,
                    "version": 1,
                    "created_at": START,
                    "updated_at": START,
                }
                for i in range(1, SCHEDULES + 1)
            ],
        )
        conn.execute(
            insert(ScheduleStep),
            [
                {
                    "schedule_id": i,
                    "step_index": g,
                    "position": 0,
                    "in_list": False,
                    "name": f"step-{g + 1}",
                    "task": "chordbeat.examples.sleep",
                    "args": [],
                    "kwargs": {},
                    "continue_on_failure": False,
                    "max_attempts": 3,
                }
                for i in range(1, SCHEDULES + 1)
                for g in range(2)
            ],
        )
        series, ts = _sql(conn.dialect.name, executions)
        # The first ``hot`` executions belong to sched-00001 (a busy interval schedule).
        owner = f"CASE WHEN i <= {hot} THEN 1 ELSE (i % {SCHEDULES}) + 1 END"
        plan = json.dumps([[{"name": f"step-{g}", "task": "chordbeat.examples.sleep"}] for g in (1, 2)])
        conn.execute(
            text(
                f"""INSERT INTO schedule_executions (id, schedule_id, schedule_name, status, trigger, run_key,
                current_step_index, plan, payload, started_at, completed_at)
                SELECT i, {owner}, 'sched-' || substr('0000' || ({owner}), -5, 5),
                CASE WHEN i % 17 = 0 THEN 'failed' ELSE 'completed' END, 'cron', 'r' || i, 1, :plan, '{{}}',
                {ts("i * 30")}, {ts("i * 30 + 20")} FROM {series}"""
            ),
            {"plan": plan},
        )
        for g in range(2):
            conn.execute(
                text(
                    f"""INSERT INTO activities (execution_id, step_index, step_name, attempt, status, worker,
                    started_at, completed_at, error)
                    SELECT i, {g}, 'step-{g + 1}', 1,
                    CASE WHEN {g} = 1 AND i % 17 = 0 THEN 'failed_with_error' ELSE 'complete' END, 'w1@host',
                    {ts(f"i * 30 + {g * 10}")}, {ts(f"i * 30 + {g * 10 + 9}")},
                    CASE WHEN {g} = 1 AND i % 17 = 0 THEN 'StepFailed: disk full' ELSE NULL END FROM {series}"""
                )
            )
        if conn.dialect.name == "postgresql":
            for table in ("schedule_executions", "activities", "schedules", "schedule_steps"):
                conn.execute(
                    text(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))")
                )
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("ANALYZE"))
    else:
        with engine.begin() as conn:
            conn.execute(text("ANALYZE"))
    engine.dispose()


def _sql(dialect: str, n: int) -> tuple[str, object]:
    if dialect == "postgresql":
        return (
            f"generate_series(1, {n}) AS s(i)",
            lambda seconds: f"TIMESTAMPTZ '2026-01-01 00:00:00+00' + ({seconds}) * INTERVAL '1 second'",
        )
    return (
        f"(WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < {n}) SELECT i FROM s)",
        lambda seconds: f"datetime('2026-01-01 00:00:00', '+' || ({seconds}) || ' seconds')",
    )


def measure(web: WebServer, paths: list[str], repeat: int) -> list[tuple[str, float, float]]:
    session = web.session(ADMIN)
    out = []
    for path in paths:
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            r = session.get(web.url + path, timeout=120)
            times.append(time.perf_counter() - started)
            assert r.status_code == 200, (path, r.status_code)
        out.append((path, statistics.median(times) * 1000, max(times) * 1000))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--executions", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--hot", type=int, default=0, help="executions that belong to sched-00001")
    args = parser.parse_args()
    redis_server = RedisServer()
    redis_server.start()
    pg = None
    if args.database == "postgresql":
        pg = PostgresServer()
        pg.start()
        url = pg.url()
    else:
        url = f"sqlite:///{tempfile.mkdtemp(prefix='chordbeat-webbench-')}/bench.db"
    try:
        upgrade(url)
        started = time.perf_counter()
        seed(url, args.executions, args.hot)
        print(f"seeded {SCHEDULES} schedules, {args.executions} executions in {time.perf_counter() - started:.0f} s")
        chordbeat_app.apply_settings(
            Settings(
                broker_url=redis_server.url,
                result_backend=redis_server.url,
                redbeat_url=redis_server.url,
                database_url=url,
            )
        )
        paths = [
            "/",
            "/?page=200",
            "/?q=sched-0999",
            "/?status=paused&page=10",
            "/schedules/fragment",
            "/schedule?name=sched-04242",
            "/schedule?name=sched-00001",
            "/?q=sched-0000",
            "/schedule/fragment?name=sched-04242",
            f"/execution/{args.executions // 2}",
            f"/execution/{args.executions // 2}/step?step=step-2",
            "/health",
        ]
        with WebServer(chordbeat_app) as web:
            results = measure(web, paths, args.repeat)
        print(f"\n{args.database}: {SCHEDULES} schedules, {args.executions} executions, {2 * args.executions} attempts")
        print("| page | median ms | max ms |\n|---|---:|---:|")
        for path, median, worst in results:
            print(f"| `{path}` | {median:.0f} | {worst:.0f} |")
    finally:
        redis_server.close()
        if pg is not None:
            pg.close()


if __name__ == "__main__":
    main()
