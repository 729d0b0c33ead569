"""What Prometheus would read from chordbeat's collector, as samples keyed by name and labels."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from celeryapp.application import ChordbeatCelery
from celeryapp.monitoring.metrics import ExecutionCollector

#: (sample name, its labels sorted) -> value.
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(app: ChordbeatCelery) -> Samples:
    """One scrape of the collector the metrics endpoint serves, parsed as Prometheus parses it."""
    registry = CollectorRegistry()
    registry.register(ExecutionCollector(app))
    text = generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
