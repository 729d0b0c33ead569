"""Ninety days of history on PostgreSQL: page and list times, a housekeeping pass, fires meanwhile.

The history (``bench.history_fill``: 10,000 schedules, 1,000,000 runs with 2,000,000 step
attempts, 13,000,000 slot records) is generated in SQL in a fresh database. Then:

- the dashboard serves its schedules, schedule, execution, health and Runs pages from a thread of
  this process, each requested ``PAGE_REPEAT`` times over HTTP on loopback (an admin's session);
  the Runs page (filtered, deep by cursor, its live fragment) and the schedule pages with their
  duration trends are also reported on their own;
- ``list_executions`` is called as a control worker serves it: a first page (all runs, one
  schedule's, the failed ones) and a page deep in the history through the cursor;
- with every schedule's 50 definition versions (500,000, and those of 100 deleted schedules) in
  place: an apply that changes a schedule (its statements and time), ``list_versions``,
  ``get_version``, ``diff_versions`` of the first and the last, ``list_executions(version=N)``,
  the dashboard's version list and diff pages (``versions_*``), and a housekeeping pass whose
  trail retention has passed every version (``versions_housekeeping_s``);
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
from celeryapp.interfaces import service, version_service
from celeryapp.recovery.housekeeping import purge
from models import ScheduleExecution, ScheduleVersion, SlotRecord
from tasks import examples  # noqa: F401  (the steps' task: an apply checks it is registered)
from tests.support.helpers import recorded_statements
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
TABLES = (
    "schedules",
    "schedule_steps",
    "schedule_executions",
    "activities",
    "schedule_slots",
    "metric_counts",
    "schedule_versions",
)
#: Changing applies timed (the first warms caches and is not counted).
APPLY_REPEAT = 21


def _pages(executions: int, schedules: int, versions: int) -> list[str]:
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
        *_version_pages(schedules, versions),
    ]


def _version_pages(schedules: int, versions: int) -> list[str]:
    """A schedule's version list (its newest 100 with their runs' failure rates) and the diff of
    its first and last versions, for a busy and a quiet schedule (``versions_page_ms``)."""
    busy, quiet = schedule_name(1), schedule_name(schedules // 2)
    return [
        f"/schedule/versions?name={busy}",
        f"/schedule/versions?name={quiet}",
        f"/schedule/diff?name={busy}&a=1&b={versions}",
        f"/schedule/diff?name={quiet}&a=1&b={versions}",
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


def _page_times(shape: HistoryShape) -> tuple[list[float], list[float], list[float], dict[str, float]]:
    every: list[float] = []
    trend: list[float] = []
    versions: list[float] = []
    trend_pages = set(_trend_pages(shape.executions, shape.schedules))
    version_pages = set(_version_pages(shape.schedules, shape.versions))
    medians: dict[str, float] = {}
    with WebServer(app) as web:
        session = web.session(ADMIN)

        def get(path: str) -> None:
            answer = session.get(web.url + path, timeout=120)
            if answer.status_code != 200:
                raise RuntimeError(f"{path}: HTTP {answer.status_code}")

        for path in _pages(shape.executions, shape.schedules, shape.versions):
            times = _timed(lambda p=path: get(p), PAGE_REPEAT)  # type: ignore[misc]
            every += times
            if path in trend_pages:
                trend += times
            if path in version_pages:
                versions += times
            medians[path] = round(statistics.median(times), 1)
    return every, trend, versions, medians


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


def _version_times(shape: HistoryShape) -> dict[str, Any]:
    """The version operations on a schedule with ``shape.versions`` versions among 500,000."""
    name = schedule_name(shape.schedules // 2)
    middle = shape.versions // 2
    calls = {
        "list_versions": lambda: version_service.list_versions(app, name),
        "get_version": lambda: version_service.get_version(app, name, middle),
        "diff_versions": lambda: version_service.diff_versions(app, name, 1, shape.versions),
        "list_executions_version": lambda: service.list_executions(app, name, None, 50, None, middle),
    }
    result: dict[str, Any] = {
        f"versions_{call}_ms": percentiles(_timed(fn, LIST_REPEAT), "p50", "p95") for call, fn in calls.items()
    }
    if not version_service.diff_versions(app, name, 1, shape.versions):
        raise RuntimeError("the first and last versions do not differ: the history's versions are not as built")
    if not service.list_executions(app, name, None, 50, None, middle):
        raise RuntimeError(f"no run of version {middle}: the history's runs name no version")
    # Changing applies: each a new retry delay, so each makes a version.
    definition = version_service.get_version(app, name, shape.versions)
    times: list[float] = []
    statements: list[int] = []
    for n in range(APPLY_REPEAT):
        with recorded_statements(app) as sent:
            started = time.perf_counter()
            service.apply_schedule(app, {**definition, "retry_delay": 1000 + n}, reason="the history bench")
            times.append((time.perf_counter() - started) * 1000)
        statements.append(len(sent))
    result["versions_apply_ms"] = percentiles(times[1:], "p50", "p95")
    result["versions_apply_statements"] = max(statements[1:])
    return result


def _version_housekeeping(bench: Bench, url: str) -> dict[str, Any]:
    """A pass from this process whose trail retention (a day) has passed every version, with a
    retention of runs longer than the history so nothing else is due: it looks at all of them and
    deletes the deleted schedules' (no kept run ran them)."""
    with bench.observe(url).connect() as conn:
        count = select(func.count()).select_from(ScheduleVersion)
        before = int(conn.scalar(count) or 0)
    app.apply_settings(dataclasses.replace(bench.settings(url), retention_days=3650, audit_retention_days=1))
    try:
        report = purge(app)
    finally:
        app.apply_settings(bench.settings(url))
    if report.unfinished or report.executions or report.slots:
        raise RuntimeError(f"the versions' pass did other work or did not finish: {report.as_json()}")
    return {
        "versions_rows": before,
        "versions_housekeeping_s": round(report.seconds, 2),
        "versions_housekeeping_deleted": report.versions,
    }


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
    pages, trend_pages, version_pages, page_medians = _page_times(shape)
    first, deep, list_medians = _list_times(shape)
    versions = _version_times(shape)
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
        "versions_per_schedule": shape.versions,
        "versions_page_ms": percentiles(version_pages, "p50", "p95"),
        **versions,
    }
    result.update(_version_housekeeping(bench, url))
    result.update(_housekeeping(bench, url, shape))
    return [result]
