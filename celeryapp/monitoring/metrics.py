"""Prometheus metrics about executions, read from the database at scrape time.

Flower only knows Celery tasks. These come from the database, the source of truth, so every
worker's work is counted once however many processes and hosts there are. Counters and histograms
are the monotonic rows of :mod:`celeryapp.monitoring.metric_counts` (added to when work finishes, never
deleted by housekeeping; a deleted schedule's series end with it), so ``rate()`` and
``histogram_quantile()`` see no drops; a scrape reads those few rows and two small counts, never
the activities. Served by ``chordbeat metrics``.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator

import redis
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from celeryapp.clock import clock
from celeryapp.domain.names import CONTROL_QUEUE, STEPS_QUEUE
from celeryapp.messaging.redis_client import get_redis
from celeryapp.messaging.reference_time import offsets, shared_correction
from celeryapp.monitoring import limit_metrics
from celeryapp.monitoring import metric_counts as mc
from celeryapp.monitoring.overload import queued, skipped_last_minute
from celeryapp.runtime import Runtime
from models import AlertKind, ExecutionStatus, MetricCount, Schedule, ScheduleExecution, ScheduleStatus, transaction

Family = GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily

#: Counters: (metric row name, exported name without ``_total``, help, label of the row's label).
COUNTERS = (
    (mc.EXECUTIONS, "chordbeat_executions", "Executions that ended, by schedule and final status", "status"),
    (mc.STEP_ATTEMPTS, "chordbeat_step_attempts", "Step attempts that ended, by schedule and outcome", "status"),
    (mc.SLOTS, "chordbeat_slots", "Due times by outcome (fired, skipped, missed, buffered, retry)", "outcome"),
)
#: Counters of the whole deployment: (metric row name, exported name without ``_total``, help, label).
DEPLOYMENT_COUNTERS = (
    (mc.ALERTS, "chordbeat_alerts", "Alerts decided, by kind (silenced ones included)", "kind"),
    (
        mc.ALERT_DELIVERY_FAILURES,
        "chordbeat_alert_delivery_failures",
        "Failed attempts to deliver an alert, by channel: a receiver (pager, mail relay) that does not take them",
        "channel",
    ),
)
#: Labels served at 0 before anything is counted, so ``increase()`` sees the first alert of a kind.
KNOWN_LABELS = {mc.ALERTS: tuple(kind.value for kind in AlertKind)}
HISTOGRAM_HELP = {
    mc.EXECUTION_DURATION: "Execution run time, observed when it ends",
    mc.STEP_DURATION: "Step attempt run time, observed when its execution ends",
    mc.ADVANCE_LATENCY: "From the last step of a group ending to the next group's first step starting, "
    "observed when the execution ends",
}


def histogram_samples(
    rows: dict[str, tuple[int, float]], buckets: tuple[float, ...]
) -> tuple[list[tuple[str, float]], float]:
    """Cumulative bucket counts and the sum, from per-bucket rows (bound text -> (count, sum))."""
    per_bound: dict[float, int] = defaultdict(int)
    total = 0.0
    for bound_text, (count, value_sum) in rows.items():
        per_bound[float("inf") if bound_text == mc.INF else float(bound_text)] += count
        total += value_sum
    samples: list[tuple[str, float]] = []
    for bound in (*buckets, float("inf")):
        cumulative = sum(n for b, n in per_bound.items() if b <= bound)
        samples.append((mc.INF if bound == float("inf") else str(bound), float(cumulative)))
    return samples, total


class ExecutionCollector(Collector):
    def __init__(self, app: Runtime) -> None:
        self.app = app

    def collect(self) -> Iterator[Family]:
        with transaction(self.app.settings.database_url, read_only=True) as session:
            yield from self._gauges(session)
            yield from limit_metrics.gauge_families(session, clock.now())
            yield from self._monotonic(session)
        yield from self._overload()

    def _gauges(self, session: Session) -> Iterator[Family]:
        running = GaugeMetricFamily("chordbeat_executions_in_progress", "Executions running now", labels=["schedule"])
        for name, count in session.execute(
            select(ScheduleExecution.schedule_name, func.count())
            .where(ScheduleExecution.status == ExecutionStatus.IN_PROGRESS)
            .group_by(ScheduleExecution.schedule_name)
        ).all():
            running.add_metric([name], count)
        yield running
        schedules = GaugeMetricFamily("chordbeat_schedules", "Schedules by status", labels=["status"])
        by_status: dict[ScheduleStatus, int] = {
            s: n for s, n in session.execute(select(Schedule.status, func.count()).group_by(Schedule.status)).all()
        }
        for schedule_status in ScheduleStatus:
            schedules.add_metric([schedule_status.value], by_status.get(schedule_status, 0))
        yield schedules

    def _monotonic(self, session: Session) -> Iterator[Family]:
        counters: dict[str, dict[tuple[str, str], int]] = defaultdict(dict)
        histograms: dict[str, dict[str, dict[str, tuple[int, float]]]] = defaultdict(lambda: defaultdict(dict))
        rows = session.execute(
            select(
                MetricCount.metric,
                MetricCount.schedule_name,
                MetricCount.label,
                MetricCount.bucket,
                MetricCount.count,
                MetricCount.total,
            )
        )
        limit_waits: dict[str, dict[str, tuple[int, float]]] = defaultdict(dict)
        for metric, schedule, label, bucket, count, value_sum in rows:
            if metric == mc.LIMIT_WAIT:
                limit_waits[label][bucket] = (count, value_sum)
            elif metric in mc.HISTOGRAMS:
                histograms[metric][schedule][bucket] = (count, value_sum)
            else:
                counters[metric][(schedule, label)] = count
        for metric, name, doc, label_name in COUNTERS:
            family = CounterMetricFamily(name, doc, labels=["schedule", label_name])
            for (schedule, label), count in sorted(counters[metric].items()):
                family.add_metric([schedule, label], count)
            yield family
        for metric, name, doc, label_name in DEPLOYMENT_COUNTERS:
            family = CounterMetricFamily(name, doc, labels=[label_name])
            by_label = {label: count for (_, label), count in counters[metric].items()}
            for label in sorted(set(KNOWN_LABELS.get(metric, ())) | set(by_label)):
                family.add_metric([label], by_label.get(label, 0))
            yield family
        requeues = CounterMetricFamily(
            "chordbeat_recovery_requeues", "Step attempts lost with their worker (re-queued, or failed out of attempts)"
        )
        requeues.add_metric([], sum(counters[mc.RECOVERY_REQUEUES].values()))
        yield requeues
        for metric, buckets in mc.HISTOGRAMS.items():
            histogram = HistogramMetricFamily(f"chordbeat_{metric}", HISTOGRAM_HELP[metric], labels=["schedule"])
            for schedule, per_bucket in sorted(histograms[metric].items()):
                samples, total = histogram_samples(per_bucket, buckets)
                histogram.add_metric([schedule], samples, sum_value=total)
            yield histogram
        admitted = CounterMetricFamily(
            "chordbeat_limit_admitted", "Step attempts admitted to each shared limit (slots taken)", labels=["limit"]
        )
        for (_, limit), count in sorted(counters[mc.LIMIT_ADMITTED].items()):
            admitted.add_metric([limit], count)
        yield admitted
        waited = HistogramMetricFamily(
            "chordbeat_limit_wait_seconds",
            "How long each step attempt admitted to a shared limit waited for it, observed at admission",
            labels=["limit"],
        )
        for limit, per_bucket in sorted(limit_waits.items()):
            samples, total = histogram_samples(per_bucket, mc.LIMIT_WAIT_BUCKETS)
            waited.add_metric([limit], samples, sum_value=total)
        yield waited

    def _overload(self) -> Iterator[Family]:
        """From Redis: skips for lack of capacity, what waits in the queues, and the clocks."""
        try:
            client = get_redis(self.app.settings.broker_url)
            skipped = skipped_last_minute(client)
            waiting = {queue: queued(client, queue) for queue in (CONTROL_QUEUE, STEPS_QUEUE)}
            clocks = offsets(client, clock.timestamp())
            correction = shared_correction(client)
        except redis.RedisError:
            return  # the database figures are still served
        skips = GaugeMetricFamily(
            "chordbeat_overlap_skips_last_minute",
            "Slots skipped in the last complete minute because the schedule's previous run was still in "
            "progress; sustained above 0 means the workers do not keep up",
        )
        skips.add_metric([], skipped)
        yield skips
        depth = GaugeMetricFamily(
            "chordbeat_queued_messages", "Messages waiting in chordbeat's queues", labels=["queue"]
        )
        for queue, count in waiting.items():
            depth.add_metric([queue], count)
        yield depth
        offset = GaugeMetricFamily(
            "chordbeat_clock_offset_seconds",
            "Each process's host clock minus the reference (Redis's), at its last reading; chordbeat keeps "
            "time by the reference, but above 5 s the host's time sync is broken",
            labels=["process"],
        )
        for entry in clocks:
            offset.add_metric([entry.process], entry.offset_s)
        yield offset
        jumps = CounterMetricFamily(
            "chordbeat_clock_jumps",
            "Jumps of the reference clock (Redis's TIME: a failover to a host with another clock, an NTP step) "
            "seen and corrected; kept with the correction in Redis",
        )
        jumps.add_metric([], correction.correction.jumps if correction else 0)
        yield jumps
        remaining = GaugeMetricFamily(
            "chordbeat_clock_correction_seconds",
            "Seconds chordbeat's time is still behind (negative: ahead of) Redis's clock after a jump; "
            "taken back slowly, 0 once done",
        )
        remaining.add_metric([], correction.remaining_s if correction else 0.0)
        yield remaining


def serve(app: Runtime, port: int, address: str) -> None:
    """Serve /metrics until interrupted."""
    registry = CollectorRegistry()
    registry.register(ExecutionCollector(app))
    start_http_server(port, addr=address, registry=registry)
    while True:
        time.sleep(3600)
