"""Prometheus metrics about executions, read from the database at scrape time.

Flower only knows Celery tasks. These come from the database, the source of truth, so every
worker's work is counted once however many processes there are. Served by ``chordbeat metrics``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import TYPE_CHECKING

import redis
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from celeryapp import keys
from celeryapp.overload import queued, skipped_last_minute
from celeryapp.redis_client import get_redis
from models import (
    Activity,
    ExecutionStatus,
    Schedule,
    ScheduleExecution,
    ScheduleStatus,
    SlotOutcome,
    SlotRecord,
    transaction,
    utcnow,
)

if TYPE_CHECKING:
    from celeryapp.app import ChordbeatCelery

#: Upper bounds (seconds) of the duration histograms.
DURATION_BUCKETS = (0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 1800, 3600, 4 * 3600, 12 * 3600)
#: Upper bounds (seconds) of the advancement latency histogram.
ADVANCE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
#: Durations and latencies are computed over runs finished this recently (bounded scrape cost).
WINDOW = timedelta(hours=24)


def _histogram(
    name: str, doc: str, label: str, values: dict[str, list[float]], buckets: tuple[float, ...]
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=[label])
    for key, observed in sorted(values.items()):
        counts = [(str(b), float(sum(1 for v in observed if v <= b))) for b in buckets]
        counts.append(("+Inf", float(len(observed))))
        family.add_metric([key], counts, sum_value=sum(observed))
    return family


class ExecutionCollector(Collector):
    def __init__(self, app: ChordbeatCelery) -> None:
        self.app = app

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily]:
        with transaction(self.app.settings.database_url, read_only=True) as session:
            yield from self._counts(session)
            yield from self._durations(session)
        yield from self._overload()

    def _counts(self, session: Session) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        executions = CounterMetricFamily(
            "chordbeat_executions", "Executions that ended, by schedule and final status", labels=["schedule", "status"]
        )
        rows = session.execute(
            select(ScheduleExecution.schedule_name, ScheduleExecution.status, func.count())
            .where(ScheduleExecution.status != ExecutionStatus.IN_PROGRESS)
            .group_by(ScheduleExecution.schedule_name, ScheduleExecution.status)
        ).all()
        for name, status, count in rows:
            executions.add_metric([name, status.value], count)
        yield executions
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
        slots = CounterMetricFamily(
            "chordbeat_slots", "Due times by outcome (fired, skipped, buffered, retry)", labels=["schedule", "outcome"]
        )
        for name, outcome, count in session.execute(
            select(SlotRecord.schedule_name, SlotRecord.outcome, func.count())
            .where(SlotRecord.outcome != SlotOutcome.FIRED)
            .group_by(SlotRecord.schedule_name, SlotRecord.outcome)
        ).all():
            slots.add_metric([name, outcome.value], count)
        yield slots
        requeues = CounterMetricFamily(
            "chordbeat_recovery_requeues", "Step attempts lost with their worker and re-queued"
        )
        requeues.add_metric([], session.scalar(select(func.count()).where(Activity.error.like("worker lost%"))) or 0)
        yield requeues

    def _durations(self, session: Session) -> Iterator[HistogramMetricFamily]:
        since = utcnow() - WINDOW
        runs: dict[str, list[float]] = {}
        for name, started, completed in session.execute(
            select(ScheduleExecution.schedule_name, ScheduleExecution.started_at, ScheduleExecution.completed_at).where(
                ScheduleExecution.completed_at >= since
            )
        ).all():
            assert completed is not None  # selected by completed_at >= since
            runs.setdefault(name, []).append((completed - started).total_seconds())
        yield _histogram(
            "chordbeat_execution_duration_seconds", "Execution run time (last 24 h)", "schedule", runs, DURATION_BUCKETS
        )
        steps: dict[str, list[float]] = {}
        groups: dict[tuple[int, int], tuple[float, float]] = {}
        schedule_of: dict[int, str] = {}
        for execution_id, name, index, started, completed in session.execute(
            select(
                Activity.execution_id,
                ScheduleExecution.schedule_name,
                Activity.step_index,
                Activity.started_at,
                Activity.completed_at,
            )
            .join(ScheduleExecution, ScheduleExecution.id == Activity.execution_id)
            .where(Activity.completed_at >= since)
        ).all():
            assert completed is not None  # selected by completed_at >= since
            steps.setdefault(name, []).append((completed - started).total_seconds())
            schedule_of[execution_id] = name
            first_start, last_end = groups.get((execution_id, index), (float("inf"), float("-inf")))
            groups[(execution_id, index)] = (
                min(first_start, started.timestamp()),
                max(last_end, completed.timestamp()),
            )
        yield _histogram(
            "chordbeat_step_duration_seconds", "Step attempt run time (last 24 h)", "schedule", steps, DURATION_BUCKETS
        )
        latency: dict[str, list[float]] = {}
        for (execution_id, index), (_start, end) in groups.items():
            following = groups.get((execution_id, index + 1))
            if following is not None:
                latency.setdefault(schedule_of[execution_id], []).append(max(following[0] - end, 0.0))
        yield _histogram(
            "chordbeat_advance_latency_seconds",
            "From the last step of a group ending to the next group's first step starting (last 24 h)",
            "schedule",
            latency,
            ADVANCE_BUCKETS,
        )

    def _overload(self) -> Iterator[GaugeMetricFamily]:
        """Backpressure from Redis: skips for lack of capacity, and what waits in the queues."""
        try:
            client = get_redis(self.app.settings.broker_url)
            skipped = skipped_last_minute(client)
            waiting = {queue: queued(client, queue) for queue in (keys.CONTROL_QUEUE, keys.STEPS_QUEUE)}
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


def serve(app: ChordbeatCelery, port: int, address: str) -> None:
    """Serve /metrics until interrupted."""
    registry = CollectorRegistry()
    registry.register(ExecutionCollector(app))
    start_http_server(port, addr=address, registry=registry)
    while True:
        time.sleep(3600)
