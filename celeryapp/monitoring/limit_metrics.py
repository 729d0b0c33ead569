"""Prometheus gauges of shared limits, read from the database at scrape time: slots, in use,
waiting and the oldest waiter's age, one series per limit.

The admission counter and the wait histogram are monotonic rows (served with the others by
:mod:`celeryapp.monitoring.metrics`) that
:func:`celeryapp.monitoring.metric_counts.observe_admissions` adds to in the transaction that
admits: every worker writes the one database, so each admission is counted once.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from sqlalchemy import select
from sqlalchemy.orm import Session

from celeryapp.domain.times import parse_time
from models.limit_tables import LIMITS, waiting_by_limit

Family = GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily
#: (exported name, help, column of the row below)
GAUGES = (
    ("chordbeat_limit_slots", "Slots of each shared limit", "slots"),
    ("chordbeat_limit_in_use", "Slots of each shared limit held now", "in_use"),
    ("chordbeat_limit_waiting", "Step attempts waiting for each shared limit now", "waiting"),
    (
        "chordbeat_limit_oldest_wait_seconds",
        "How long the oldest waiter of each shared limit has waited (0: none waits)",
        "oldest_s",
    ),
)


def gauge_families(session: Session, now: datetime) -> Iterator[Family]:
    """The limits as they are: one grouped read of the waiters, one of the limits."""
    waiting = waiting_by_limit()
    rows = session.execute(
        select(LIMITS.c.name, LIMITS.c.slots, LIMITS.c.in_use, waiting.c.waiting, waiting.c.oldest)
        .outerjoin(waiting, waiting.c.limit_id == LIMITS.c.id)
        .order_by(LIMITS.c.name)
    ).all()
    families = {name: GaugeMetricFamily(name, doc, labels=["limit"]) for name, doc, _ in GAUGES}
    for name, slots, in_use, count, oldest in rows:
        # An aggregate's time comes back from SQLite as its stored text.
        since = parse_time(oldest) if isinstance(oldest, str) else oldest
        values = {
            "slots": slots,
            "in_use": in_use,
            "waiting": count or 0,
            "oldest_s": max(0.0, (now - since).total_seconds()) if since is not None else 0.0,
        }
        for family_name, _, column in GAUGES:
            families[family_name].add_metric([name], values[column])
    yield from families.values()
