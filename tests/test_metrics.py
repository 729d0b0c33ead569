"""Prometheus metrics: counters and histograms never go down, a deleted schedule's series are retired,
a scrape reads no activities, and the shipped Grafana dashboard only uses metrics that exist."""

from __future__ import annotations

import json
import re
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from celery import Celery
from sqlalchemy import event, select

from celeryapp.application import ChordbeatCelery
from celeryapp.monitoring.metric_counts import bucket_of, retire_orphans
from celeryapp.monitoring.metrics import ExecutionCollector, histogram_samples
from celeryapp.recovery.housekeeping import purge
from celeryapp.scheduling.schedule_file import apply_file
from models import MetricCount, transaction, utcnow
from models.session import get_engine
from tests.support.helpers import call, execution, finished, running, step
from tests.support.scrapes import Samples, scrape

pytestmark = pytest.mark.both_databases

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "chordbeat.json"


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def run(client: Celery, name: str) -> dict[str, Any]:
    return finished(client, call(client, "chordbeat.trigger_schedule", name=name)["execution_id"])


def test_counters_and_histograms_do_not_drop_when_housekeeping_deletes_history(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    steps = [[step("a"), step("bad", "chordbeat.examples.fail", continue_on_failure=True)], step("b")]
    call(client, "chordbeat.apply_schedule", definition={"name": "m", "every": 3600, "steps": steps})
    assert run(client, "m")["status"] == "completed"
    assert run(client, "m")["status"] == "completed"
    before = scrape(app)
    assert value(before, "chordbeat_executions_total", schedule="m", status="completed") == 2
    assert value(before, "chordbeat_step_attempts_total", schedule="m", status="complete") == 4
    assert value(before, "chordbeat_step_attempts_total", schedule="m", status="failed_with_error") == 2
    assert value(before, "chordbeat_slots_total", schedule="m", outcome="fired") == 2
    assert value(before, "chordbeat_step_duration_seconds_count", schedule="m") == 6
    assert value(before, "chordbeat_execution_duration_seconds_count", schedule="m") == 2
    assert value(before, "chordbeat_advance_latency_seconds_count", schedule="m") == 2

    # Retention passes for both runs: housekeeping deletes them with their activities and slots.
    removed = purge(app, now=utcnow() + timedelta(days=app.settings.retention_days + 1))
    assert (removed.executions, removed.slots) == (2, 2)
    after = scrape(app)
    monotonic = [k for k in before if k[0].endswith(("_total", "_count", "_sum", "_bucket"))]
    assert monotonic
    for key in monotonic:
        assert after.get(key, 0.0) >= before[key], key

    assert run(client, "m")["status"] == "completed"
    again = scrape(app)
    assert value(again, "chordbeat_executions_total", schedule="m", status="completed") == 3
    assert value(again, "chordbeat_step_duration_seconds_count", schedule="m") == 9
    _assert_histograms_well_formed(again)


def of_schedule(samples: Samples, name: str) -> Samples:
    return {key: v for key, v in samples.items() if ("schedule", name) in key[1]}


def rows_of(app: ChordbeatCelery, name: str) -> int:
    with transaction(app.settings.database_url, read_only=True) as session:
        return len(session.scalars(select(MetricCount.metric).where(MetricCount.schedule_name == name)).all())


def test_a_deleted_schedules_series_are_retired_and_a_new_one_of_its_name_starts_from_zero(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    for name in ("gone", "kept"):
        call(client, "chordbeat.apply_schedule", definition={"name": name, "every": 3600, "steps": [step("a")]})
        assert run(client, name)["status"] == "completed"
    # A run still in flight when its schedule is deleted ends afterwards.
    long = {"name": "gone", "every": 3600, "steps": [step("long", kwargs={"seconds": 2})]}
    call(client, "chordbeat.apply_schedule", definition=long)
    in_flight = call(client, "chordbeat.trigger_schedule", name="gone")["execution_id"]
    running(client, in_flight, "long")
    before = scrape(app)
    assert of_schedule(before, "gone") and of_schedule(before, "kept")

    call(client, "chordbeat.delete_schedule", name="gone")
    assert execution(client, in_flight)["status"] == "in_progress"
    # Only the gauge of the run still going is left: its counters and histograms went with the schedule.
    assert list(of_schedule(scrape(app), "gone")) == [("chordbeat_executions_in_progress", (("schedule", "gone"),))]
    assert finished(client, in_flight)["status"] == "completed"
    after = scrape(app)
    assert not of_schedule(after, "gone"), "the run that ended after the delete brought the series back"
    assert rows_of(app, "gone") == 0
    assert of_schedule(after, "kept") == of_schedule(before, "kept")
    requeues = ("chordbeat_recovery_requeues_total", ())
    assert after[requeues] == before[requeues]

    call(client, "chordbeat.apply_schedule", definition={"name": "gone", "every": 3600, "steps": [step("a")]})
    assert run(client, "gone")["status"] == "completed"
    again = scrape(app)
    assert value(again, "chordbeat_executions_total", schedule="gone", status="completed") == 1
    assert value(again, "chordbeat_slots_total", schedule="gone", outcome="fired") == 1
    assert value(again, "chordbeat_step_duration_seconds_count", schedule="gone") == 1
    _assert_histograms_well_formed(again)


def test_a_schedule_pruned_from_its_file_loses_its_series(
    app: ChordbeatCelery, worker: Any, client: Celery, tmp_path: Path
) -> None:
    path = tmp_path / "schedules.yaml"
    both = [{"name": n, "every": 3600, "steps": [step("a")]} for n in ("pruned", "stays")]
    path.write_text(yaml.safe_dump({"schedules": both}))
    apply_file(app, path)
    for name in ("pruned", "stays"):
        assert run(client, name)["status"] == "completed"
    before = scrape(app)
    path.write_text(yaml.safe_dump({"schedules": both[1:]}))
    assert apply_file(app, path).removed == ["pruned"]
    after = scrape(app)
    assert not of_schedule(after, "pruned") and rows_of(app, "pruned") == 0
    assert of_schedule(after, "stays") == of_schedule(before, "stays")


def test_housekeeping_can_retire_rows_left_by_schedules_deleted_before_the_upgrade(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    call(client, "chordbeat.apply_schedule", definition={"name": "live", "every": 3600, "steps": [step("a")]})
    assert run(client, "live")["status"] == "completed"
    with transaction(app.settings.database_url) as session:
        session.add(MetricCount(metric="executions", schedule_name="old", label="completed", bucket="", count=7))
        session.add(MetricCount(metric="recovery_requeues", schedule_name="", label="", bucket="", count=3))
    before = scrape(app)
    with transaction(app.settings.database_url) as session:
        assert retire_orphans(session) == 1
    after = scrape(app)
    assert not of_schedule(after, "old")
    assert of_schedule(after, "live") == of_schedule(before, "live")
    assert value(after, "chordbeat_recovery_requeues_total") == 3


def _assert_histograms_well_formed(samples: Samples) -> None:
    buckets: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[float, float]]] = {}
    for (name, labels), count in samples.items():
        if name.endswith("_bucket"):
            le = dict(labels)["le"]
            rest = tuple((k, v) for k, v in labels if k != "le")
            buckets.setdefault((name.removesuffix("_bucket"), rest), []).append((float(le), count))
    assert buckets
    for (name, labels), points in buckets.items():
        counts = [c for _, c in sorted(points)]
        assert counts == sorted(counts), (name, labels, points)
        assert counts[-1] == samples[(f"{name}_count", labels)], name


def test_histogram_rows_become_cumulative_buckets() -> None:
    buckets = (0.1, 1.0, 10.0)
    assert [bucket_of(v, buckets) for v in (0, 0.1, 0.5, 10, 11)] == ["0.1", "0.1", "1.0", "10.0", "+Inf"]
    samples, total = histogram_samples({"0.1": (2, 0.1), "10.0": (1, 7.0), "+Inf": (3, 90.0)}, buckets)
    assert samples == [("0.1", 2.0), ("1.0", 2.0), ("10.0", 3.0), ("+Inf", 6.0)]
    assert total == 97.1


def test_a_scrape_reads_no_activities_or_executions_history(app: ChordbeatCelery, worker: Any, client: Celery) -> None:
    call(client, "chordbeat.apply_schedule", definition={"name": "s", "every": 3600, "steps": [step("a")]})
    run(client, "s")
    statements: list[str] = []
    # The in-process worker shares the engine, and may still be ending the run it just reported.
    scraper = threading.get_ident()

    def seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if threading.get_ident() == scraper:
            statements.append(statement)

    engine = get_engine(app.settings.database_url)
    event.listen(engine, "before_cursor_execute", seen)
    try:
        samples = scrape(app)
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    assert value(samples, "chordbeat_executions_total", schedule="s", status="completed") == 1
    assert statements and not [s for s in statements if "activities" in s]
    # Executions are only counted while in progress (a gauge), never read back over a window.
    assert all("completed_at" not in s for s in statements)


def _exported_names(app: ChordbeatCelery) -> set[str]:
    """Every series name the exporter can serve, families without samples included."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    return {f.name + suffix for f in ExecutionCollector(app).collect() for suffix in suffixes[f.type]}


def test_grafana_dashboard_parses_and_uses_only_exported_metrics(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] and dashboard["panels"]
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    assert exprs
    used = {name for e in exprs for name in re.findall(r"\b(chordbeat_[a-z_]+|flower_[a-z_]+)\b", e)}
    call(client, "chordbeat.apply_schedule", definition={"name": "g", "every": 3600, "steps": [[step("a")], step("b")]})
    run(client, "g")
    exported = _exported_names(app)
    # Flower's own metrics (served by Flower at /metrics) the dashboard may also use.
    flower = {"flower_events_total", "flower_worker_online", "flower_task_runtime_seconds_bucket"}
    unknown = sorted(used - exported - flower)
    assert not unknown, f"the dashboard uses metrics nobody exports: {unknown}"
    assert {n for n in used if n.startswith("chordbeat_")}, used
