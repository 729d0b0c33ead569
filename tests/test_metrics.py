"""Prometheus metrics: counters and histograms never go down, a scrape reads no activities, and the
shipped Grafana dashboard only uses metrics that exist."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

from celery import Celery
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import event

from celeryapp.app import ChordbeatCelery
from celeryapp.monitoring.metric_counts import bucket_of
from celeryapp.monitoring.metrics import ExecutionCollector, histogram_samples
from celeryapp.recovery.housekeeping import purge
from models import utcnow
from models.session import get_engine
from tests.helpers import call, finished, step

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "chordbeat.json"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(app: ChordbeatCelery) -> Samples:
    registry = CollectorRegistry()
    registry.register(ExecutionCollector(app))
    text = generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


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
    assert removed == {"executions": 2, "slots": 2}
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

    def seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
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
