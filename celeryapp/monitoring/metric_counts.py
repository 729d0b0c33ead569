"""Monotonic metric counts, kept in the database beside what they count.

Each finished execution is observed once, in the transaction that finishes it: its final status,
its run time, each step attempt's outcome and run time, and the pause between its groups. Slot
outcomes are counted where slots are recorded, re-queues where recovery re-queues. Rows only
grow (upserts adding to them) and housekeeping never deletes them for purging history, so the
exported counters and histograms never go down, whichever worker host did the work, and a scrape
reads a few rows per schedule instead of a day of activities.

A deleted schedule's rows go with it (:func:`retire_schedule`, in the transaction deleting it): its
series disappear, which ``rate()`` handles as a series ending, instead of living on for every name
ever used. Nothing is counted for a schedule that no longer exists afterwards (a run still in flight
ends unobserved), so a schedule created again with the same name starts from zero and never gets
the old one's counts. The deployment-wide rows (``schedule_name`` empty) are never deleted.

(Why not prometheus_client's multiprocess mode: its files live on one host and belong to the
processes that wrote them; work is recorded on many worker hosts, and the exporter is another
process. The database is already the one place every worker writes.)
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, delete, exists, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from models import Activity, ActivityStatus, ExecutionStatus, MetricCount, Schedule, ScheduleExecution
from models.session import NO_SYNC, affected

#: Upper bounds (seconds) of the duration histograms.
DURATION_BUCKETS = (0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 1800, 3600, 4 * 3600, 12 * 3600)
#: Upper bounds (seconds) of the advancement latency histogram.
ADVANCE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

EXECUTIONS = "executions"
STEP_ATTEMPTS = "step_attempts"
SLOTS = "slots"
RECOVERY_REQUEUES = "recovery_requeues"
#: Alerts decided, by kind; deliveries given up or failed, by channel (both deployment-wide).
ALERTS = "alerts"
ALERT_DELIVERY_FAILURES = "alert_delivery_failures"
EXECUTION_DURATION = "execution_duration_seconds"
STEP_DURATION = "step_duration_seconds"
ADVANCE_LATENCY = "advance_latency_seconds"
#: Histogram metrics and their buckets.
HISTOGRAMS = {
    EXECUTION_DURATION: DURATION_BUCKETS,
    STEP_DURATION: DURATION_BUCKETS,
    ADVANCE_LATENCY: ADVANCE_BUCKETS,
}
#: Shared limits' admissions (a counter) and how long each admitted step waited (a histogram), by
#: limit: the limit's name is the row's ``label``, its ``schedule_name`` empty (docs/limits.md).
LIMIT_ADMITTED = "limit_admitted"
LIMIT_WAIT = "limit_wait_seconds"
#: Upper bounds (seconds) of the wait: most admissions are at once, a starved one waits minutes.
LIMIT_WAIT_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600)
#: Metrics kept per schedule (the others have an empty ``schedule_name``, for the whole deployment).
PER_SCHEDULE = (EXECUTIONS, STEP_ATTEMPTS, SLOTS, EXECUTION_DURATION, STEP_DURATION, ADVANCE_LATENCY)
INF = "+Inf"

#: (metric, schedule, label, bucket) -> (count, sum)
Key = tuple[str, str, str, str]


def bucket_of(value: float, buckets: tuple[float, ...]) -> str:
    """The smallest upper bound holding ``value``, as the row stores it."""
    index = bisect.bisect_left(buckets, value)
    return INF if index == len(buckets) else bound_text(buckets[index])


def bound_text(bound: float) -> str:
    return repr(float(bound))


class Counts:
    """Increments gathered in memory, written by :meth:`add_to` as one upsert."""

    def __init__(self) -> None:
        self.rows: dict[Key, list[float]] = defaultdict(lambda: [0, 0.0])

    def count(self, metric: str, schedule: str, label: str, n: int = 1) -> None:
        self.rows[(metric, schedule, label, "")][0] += n

    def observe(self, metric: str, schedule: str, value: float) -> None:
        value = max(value, 0.0)
        row = self.rows[(metric, schedule, "", bucket_of(value, HISTOGRAMS[metric]))]
        row[0] += 1
        row[1] += value

    def observe_labelled(self, metric: str, label: str, value: float, buckets: tuple[float, ...]) -> None:
        """A histogram kept for the deployment by ``label`` (a limit's name), not by schedule."""
        value = max(value, 0.0)
        row = self.rows[(metric, "", label, bucket_of(value, buckets))]
        row[0] += 1
        row[1] += value

    def add_to(self, session: Session) -> None:
        if not self.rows:
            return
        # Sorted: concurrent transactions lock the rows they share in the same order (no deadlock).
        values = [
            {"metric": m, "schedule_name": s, "label": lb, "bucket": b, "count": int(c), "total": t}
            for (m, s, lb, b), (c, t) in sorted(self.rows.items())
        ]
        connection = session.connection()
        connection.execute(_UPSERTS[connection.dialect.name == "postgresql"], values)


def _upsert(dialect: Any) -> Any:
    """``INSERT ... ON CONFLICT DO UPDATE`` adding to the row; built once (compiling it costs more
    than running it)."""
    statement = dialect.insert(MetricCount)
    return statement.on_conflict_do_update(
        index_elements=["metric", "schedule_name", "label", "bucket"],
        set_={
            "count": MetricCount.count + statement.excluded.count,
            "total": MetricCount.total + statement.excluded.total,
        },
    )


#: By "is it PostgreSQL" (else SQLite, whose upsert has the same form).
_UPSERTS = {True: _upsert(postgresql), False: _upsert(sqlite)}


def _span(rows: Iterable[tuple[datetime, datetime]]) -> tuple[float, float]:
    starts, ends = zip(*rows, strict=True)
    return min(s.timestamp() for s in starts), max(e.timestamp() for e in ends)


#: The execution's attempts, each beside its schedule's id: no row at all when the schedule is
#: gone, one with empty attempt columns when it has no attempts (one round trip for both).
_ATTEMPTS = (
    select(Schedule.id, Activity.step_index, Activity.status, Activity.started_at, Activity.completed_at)
    .outerjoin(Activity, Activity.execution_id == bindparam("p_execution_id"))
    .where(Schedule.id == bindparam("p_schedule_id"))
)


def observe_execution(session: Session, execution: ScheduleExecution, status: ExecutionStatus, now: datetime) -> None:
    """Count a finished execution, its step attempts and its pauses between groups.

    Attempts still open count as cancelled when the execution ends (that is what a cancel
    records for them next). Not counted if the schedule was deleted meanwhile: its series were
    retired with it (the caller holds the schedule's row lock when it still exists, so the delete
    either committed before, and is seen here, or waits and retires these rows too).
    """
    if execution.schedule_id is None:
        return
    params = {"p_execution_id": execution.id, "p_schedule_id": execution.schedule_id}
    rows = session.execute(_ATTEMPTS, params).all()
    if not rows:
        return
    name = execution.schedule_name
    counts = Counts()
    counts.count(EXECUTIONS, name, status.value)
    counts.observe(EXECUTION_DURATION, name, (now - execution.started_at).total_seconds())
    groups: dict[int, list[tuple[datetime, datetime]]] = defaultdict(list)
    for _schedule_id, index, outcome, started, completed in rows:
        if outcome is None:
            continue  # no attempts
        if outcome is ActivityStatus.IN_PROGRESS:
            outcome, completed = ActivityStatus.CANCELLED, now
        end = completed or now
        counts.count(STEP_ATTEMPTS, name, outcome.value)
        counts.observe(STEP_DURATION, name, (end - started).total_seconds())
        groups[index].append((started, end))
    spans = {index: _span(rows) for index, rows in groups.items()}
    for index, (_first_start, last_end) in spans.items():
        following = spans.get(index + 1)
        if following is not None:
            counts.observe(ADVANCE_LATENCY, name, following[0] - last_end)
    counts.add_to(session)


def count_requeue(session: Session) -> None:
    counts = Counts()
    counts.count(RECOVERY_REQUEUES, "", "")
    counts.add_to(session)


def observe_admissions(session: Session, admitted: Iterable[tuple[str, float]]) -> None:
    """Count admissions to shared limits, each ``(limit name, seconds waited)``, in the transaction
    that admits them: rows every worker's transactions add to, as the others."""
    counts = Counts()
    for limit, waited_s in admitted:
        counts.count(LIMIT_ADMITTED, "", limit)
        counts.observe_labelled(LIMIT_WAIT, limit, waited_s, LIMIT_WAIT_BUCKETS)
    counts.add_to(session)


def retire_limit(session: Session, name: str) -> None:
    """Delete a limit's rows, in the transaction deleting it: its series end with it."""
    session.execute(
        delete(MetricCount).where(
            MetricCount.metric.in_((LIMIT_ADMITTED, LIMIT_WAIT)),
            MetricCount.schedule_name == "",
            MetricCount.label == name,
        ),
        execution_options=NO_SYNC,
    )


def retire_schedule(session: Session, name: str) -> None:
    """Delete the rows of schedule ``name``, in the transaction that deletes it."""
    # ``metric IN (...)``: the primary key starts with the metric, so this is a few index lookups,
    # not a scan of every schedule's rows.
    session.execute(
        delete(MetricCount).where(MetricCount.metric.in_(PER_SCHEDULE), MetricCount.schedule_name == name),
        execution_options=NO_SYNC,
    )


def retire_orphans(session: Session) -> int:
    """Delete the rows of names no schedule has (kept by versions that never retired them); for
    housekeeping. Returns how many rows went."""
    orphan = ~exists().where(Schedule.name == MetricCount.schedule_name)
    return affected(session, delete(MetricCount).where(MetricCount.metric.in_(PER_SCHEDULE), orphan))
