"""Ninety days of history on PostgreSQL: page and list times, a housekeeping pass, fires meanwhile.

The history (``bench.history_fill``: 10,000 schedules, 1,000,000 runs with 2,000,000 step
attempts, 13,000,000 slot records) is generated in SQL in a fresh database. Then:

- the dashboard serves its schedules, schedule, execution, health and Runs pages from a thread of
  this process, each requested ``PAGE_REPEAT`` times over HTTP on loopback (an admin's session);
  the Runs page (filtered, deep by cursor, its live fragment) and the schedule pages with their
  duration trends are also reported on their own;
- ``list_executions`` is called as a control worker serves it: a first page (all runs, one
  schedule's, the failed ones) and a page deep in the history through the cursor;
- a worker and beat start on the database (the busy schedules fire every minute, their slots
  spread over it, the nightly ones at their minutes); once beat fires, a housekeeping pass is sent
  to the worker with a retention one day shorter than the history, so it deletes one day of it
  (``housekeeping_pass_s``); then passes from this process, as from another control host, delete
  one more day each, back to back, for a minute. The fires whose slots fall in that minute are
  timed as the staggered scenario times them (``housekeeping_fire_lateness_ms``).
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select, text

from bench.harness import Bench, poll, running
from bench.history_fill import HistoryShape, fill, schedule_name
from bench.stats import percentiles
from celeryapp import app
from celeryapp.interfaces import service
from celeryapp.recovery.housekeeping import purge
from models import ScheduleExecution, SlotRecord
from tests.support.web_server import ADMIN, WebServer

FULL = HistoryShape()
QUICK = HistoryShape(schedules=1_000, executions=100_000, slots=1_300_000, busy_schedules=10)
#: Requests of each page (the first of each warms the caches and is not counted).
PAGE_REPEAT = 11
#: Calls of each list.
LIST_REPEAT = 11
#: How deep the deep page of ``list_executions`` starts (runs newer than its cursor).
DEEP_RUNS = 500_000
#: A pass not done in this long is reported as this long.
PASS_LIMIT_S = 900.0
#: Passes go on, a day further each, for this long after the worker's pass started.
STRESS_S = 60.0
#: Fires after the passes ended are waited for this long.
DRAIN_S = 30.0
TABLES = ("schedules", "schedule_steps", "schedule_executions", "activities", "schedule_slots", "metric_counts")


def _pages(executions: int, schedules: int) -> list[str]:
    busy = schedule_name(1)
    return [
        "/",
        f"/?page={schedules // 100}",
        "/?q=hist-0999",
        "/schedules/fragment",
        f"/schedule/fragment?name={busy}",
        f"/execution/{executions}",
        f"/execution/{executions // 3}",
        f"/execution/{executions}/step?step=step-2",
        "/health",
        *_trend_pages(executions, schedules),
    ]


def _trend_pages(executions: int, schedules: int) -> list[str]:
    """The Runs page (filters, a deep page, its live fragments) and the schedule pages with their
    duration charts: also timed on their own (``history_runs_page_ms``)."""
    busy, quiet = schedule_name(1), schedule_name(schedules // 2)
    deep = executions // 2
    return [
        f"/schedule?name={busy}",
        f"/schedule?name={quiet}",
        "/runs",
        "/runs/fragment",
        "/runs/trends",
        f"/runs/trends?schedule={busy}&since=24h",
        "/runs?state=failed&since=24h",
        "/runs?trigger=manual",
        f"/runs?schedule={busy}",
        f"/runs?before={deep}",
        f"/runs?state=failed&before={deep}",
        f"/runs?schedule={quiet}&before={deep}",
    ]


def _timed(call: Any, repeat: int) -> list[float]:
    """Milliseconds of each call but the first (which warms caches)."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return times[1:]


def _page_times(shape: HistoryShape) -> tuple[list[float], list[float], dict[str, float]]:
    every: list[float] = []
    trend: list[float] = []
    trend_pages = set(_trend_pages(shape.executions, shape.schedules))
    medians: dict[str, float] = {}
    with WebServer(app) as web:
        session = web.session(ADMIN)

        def get(path: str) -> None:
            answer = session.get(web.url + path, timeout=120)
            if answer.status_code != 200:
                raise RuntimeError(f"{path}: HTTP {answer.status_code}")

        for path in _pages(shape.executions, shape.schedules):
            times = _timed(lambda p=path: get(p), PAGE_REPEAT)  # type: ignore[misc]
            every += times
            if path in trend_pages:
                trend += times
            medians[path] = round(statistics.median(times), 1)
    return every, trend, medians


def _list_times(shape: HistoryShape) -> tuple[list[float], list[float], dict[str, float]]:
    deep_cursor = shape.executions - min(DEEP_RUNS, shape.executions // 2)
    first_calls = {
        "all": lambda: service.list_executions(app, None, None, 50),
        "one schedule": lambda: service.list_executions(app, schedule_name(2), None, 50),
        "failed": lambda: service.list_executions(app, None, "failed", 50),
        "schedules": lambda: service.list_schedules(app, 500),
    }
    deep_calls = {
        "all, deep": lambda: service.list_executions(app, None, None, 50, deep_cursor),
        "failed, deep": lambda: service.list_executions(app, None, "failed", 50, deep_cursor),
        "schedules, deep": lambda: service.list_schedules(app, 500, schedule_name(shape.schedules // 2)),
    }
    first: list[float] = []
    deep: list[float] = []
    medians: dict[str, float] = {}
    for calls, into in ((first_calls, first), (deep_calls, deep)):
        for name, call in calls.items():
            times = _timed(call, LIST_REPEAT)
            into += times
            medians[name] = round(statistics.median(times), 1)
    return first, deep, medians


def _sizes(bench: Bench, url: str) -> dict[str, int]:
    with bench.engine(url).connect() as conn:
        return {t: int(conn.scalar(text(f"SELECT pg_total_relation_size('{t}')")) or 0) for t in TABLES}


def _due(bench: Bench, url: str, cutoff: datetime) -> int:
    with bench.observe(url).connect() as conn:
        query = select(func.count()).where(ScheduleExecution.completed_at < cutoff)
        runs = int(conn.scalar(query) or 0)
        return runs + int(conn.scalar(select(func.count()).where(SlotRecord.recorded_at < cutoff)) or 0)


def _lateness(bench: Bench, url: str, start: datetime, end: datetime) -> list[float]:
    """Lateness (ms) of every slot due in [start, end): its run's creation (or its record's) - the slot."""
    made = func.coalesce(ScheduleExecution.started_at, SlotRecord.recorded_at)
    query = (
        select(func.extract("epoch", made - SlotRecord.nominal_at) * 1000)
        .outerjoin(ScheduleExecution, ScheduleExecution.id == SlotRecord.execution_id)
        .where(SlotRecord.nominal_at >= start, SlotRecord.nominal_at < end)
    )
    with bench.observe(url).connect() as conn:
        return [float(r) for r in conn.scalars(query)]


def _housekeeping(bench: Bench, url: str, shape: HistoryShape) -> dict[str, Any]:
    """A worker and beat on the history; passes deleting day after day while beat fires."""
    retention = shape.days - 1
    settings = dataclasses.replace(bench.settings(url), retention_days=retention)
    worker, beat = bench.worker(settings, name="history-w"), bench.beat(settings, name="history-beat")
    with running(worker, beat):
        client = bench.client(settings)
        bench.wait_for_worker(client)
        began = datetime.now(UTC)
        with bench.observe(url).connect() as conn:
            # Beat's first fires: its start-up repair of 10,000 entries is done.
            poll(
                lambda: conn.scalar(select(func.count()).where(SlotRecord.recorded_at > began)) or None,
                300,
                "beat's first fires",
            )
        # The worker's pass: the oldest day (its retention is a day shorter than the history).
        cutoff = datetime.now(UTC) - timedelta(days=retention)
        due = _due(bench, url, cutoff)
        start = datetime.now(UTC)
        client.call("chordbeat.housekeeping")
        poll(lambda: _due(bench, url, cutoff) == 0 or None, PASS_LIMIT_S, "housekeeping to delete a day")
        pass_s = (datetime.now(UTC) - start).total_seconds()
        # Then passes from this process (another control host), each a day further, back to back for
        # a while: enough fires fall inside them to give the lateness a p99.
        app.apply_settings(settings)
        days = 0
        while (datetime.now(UTC) - start).total_seconds() < STRESS_S and days < shape.days - 2:
            days += 1
            purge(app, now=datetime.now(UTC) + timedelta(days=days))
        end = datetime.now(UTC)
        time.sleep(DRAIN_S)  # the scenario's timetable: fires due during the passes get time to land
        late = _lateness(bench, url, start, end)
    return {
        "housekeeping_pass_s": pass_s,
        "housekeeping_rows_deleted": due,
        "housekeeping_days_deleted": 1 + days,
        "housekeeping_fire_lateness_ms": percentiles(late or [0.0], "p50", "p99"),
        "housekeeping_fires_during_passes": len(late),
    }


def history(bench: Bench) -> list[dict[str, Any]]:
    """One run (the history takes minutes to build): the figures of 90 days of history."""
    shape = QUICK if bench.quick else FULL
    url = bench.fresh_database()
    began = time.monotonic()
    with bench.engine(url).connect() as conn:
        fill(conn, shape, datetime.now(UTC))
    filled_s = time.monotonic() - began
    print(f"bench: history of {shape.executions:,} runs filled in {filled_s:.0f} s", file=sys.stderr, flush=True)
    sizes = _sizes(bench, url)
    app.apply_settings(bench.settings(url))
    pages, trend_pages, page_medians = _page_times(shape)
    first, deep, list_medians = _list_times(shape)
    result: dict[str, Any] = {
        "history_executions": shape.executions,
        "history_slots": shape.slots,
        "history_schedules": shape.schedules,
        "history_fill_s": filled_s,
        "history_mib": round(sum(sizes.values()) / 2**20),
        "history_table_mib": {t: round(n / 2**20) for t, n in sizes.items()},
        "history_page_ms": percentiles(pages, "p50", "p95"),
        "history_page_median_ms": page_medians,
        "history_runs_page_ms": percentiles(trend_pages, "p50", "p95"),
        "history_list_ms": {
            **{f"first_{k}": v for k, v in percentiles(first, "p50", "p95").items()},
            **{f"deep_{k}": v for k, v in percentiles(deep, "p50", "p95").items()},
        },
        "history_list_median_ms": list_medians,
    }
    result.update(_housekeeping(bench, url, shape))
    return [result]
