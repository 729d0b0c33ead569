"""How long schedules' runs take, as the dashboard shows it: one schedule's latest completed runs
(the schedule page's chart and its p50/p95), and across schedules the slowest ones and the ones
getting slower (the Runs page), by :func:`celeryapp.domain.durations.duration_trend`'s rule.

Across schedules the trend is not computed for every schedule (10,000 schedules' latest runs would
be read on each view). The candidates are the ``CANDIDATES`` schedules with the longest mean
duration among runs completed in the last ``WINDOW``, and the ``CANDIDATES`` whose mean there grew
most against the ``WINDOW`` before (one aggregate over those two windows' index range); each
candidate's latest runs are then read in one statement (an index range each), and the rule is
applied to them. A schedule that completed no run in the last ``WINDOW`` is not listed.

The Runs page's filters narrow what is read: one schedule, one trigger, runs started in a time
range (the windows then end where the range does, and no run started before it is read). A
filter by state does not apply: durations are those of completed runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, case, func, select, union_all
from sqlalchemy.orm import Session

from celeryapp.domain.durations import TREND_RUNS, DurationTrend, duration_trend
from celeryapp.interfaces.web.run_list import RunFilter
from models import ExecutionStatus, Schedule, ScheduleExecution

#: Completed runs a schedule's trend reads: the latest window and the one before.
TREND_READ = 2 * TREND_RUNS
#: Runs completed this recently make a schedule a candidate for "slowest" and "getting slower".
WINDOW = timedelta(hours=24)
#: Schedules whose trend the Runs page computes: this many by the longest mean duration in the
#: window, and this many by how much that mean grew against the window before.
CANDIDATES = 50
#: Schedules in each of the Runs page's lists.
LISTED = 5


@dataclass(frozen=True)
class RunDuration:
    id: int
    seconds: float


@dataclass
class ScheduleDurations:
    """A schedule's latest completed runs, newest first, and their trend."""

    runs: list[RunDuration]
    trend: DurationTrend


@dataclass(frozen=True)
class ScheduleTrend:
    name: str
    trend: DurationTrend


@dataclass
class TrendsView:
    slowest: list[ScheduleTrend] = field(default_factory=list)
    slower: list[ScheduleTrend] = field(default_factory=list)
    #: Schedules considered (completed a run in the window, up to CANDIDATES).
    considered: int = 0


def _seconds(session: Session) -> ColumnElement[Any]:
    """A run's duration in seconds in SQL: each database subtracts times its own way (and
    reading the two times back costs more than the query at a page of 4,000 runs)."""
    run = ScheduleExecution
    if session.get_bind().dialect.name == "sqlite":
        # julianday keeps about 10 µs of a day: rounded to the millisecond, 5 s reads 5 s.
        return func.round((func.julianday(run.completed_at) - func.julianday(run.started_at)) * 86400.0, 3)
    return func.extract("epoch", run.completed_at - run.started_at)


def _narrowed(wanted: RunFilter) -> list[ColumnElement[bool]]:
    """The Runs page's filters that apply to durations (all but the state and the cursor)."""
    run = ScheduleExecution
    found: list[ColumnElement[bool]] = []
    if wanted.schedule is not None:
        found.append(run.schedule_name == wanted.schedule)
    if wanted.trigger is not None:
        found.append(run.trigger == wanted.trigger)
    if wanted.since is not None:
        found.append(run.started_at >= wanted.since)
    if wanted.until is not None:
        found.append(run.started_at < wanted.until)
    return found


def _completed(session: Session, schedule_id: int, narrowed: Sequence[ColumnElement[bool]] = ()) -> Any:
    """The schedule's latest ``TREND_READ`` completed runs, walking the (schedule_id, id) index back.

    The schedule is said as a range of one and the order names it: with ``schedule_id = :id``
    PostgreSQL drops the column from the order and, for a busy schedule (a run in 40 of all),
    walked the primary key back through every schedule's runs instead, reading 1,600 rows for
    40 (tests/test_query_plans.py)."""
    run = ScheduleExecution
    return (
        select(run.schedule_id, run.id, _seconds(session))
        .where(
            run.schedule_id >= schedule_id,
            run.schedule_id <= schedule_id,
            run.status == ExecutionStatus.COMPLETED,
            run.completed_at.is_not(None),
            *narrowed,
        )
        .order_by(run.schedule_id.desc(), run.id.desc())
        .limit(TREND_READ)
    )


def _durations(rows: Sequence[Any]) -> list[RunDuration]:
    return [RunDuration(run_id, max(0.0, float(seconds))) for _, run_id, seconds in rows]


def schedule_durations(session: Session, schedule_id: int) -> ScheduleDurations:
    """The schedule page's chart: its latest completed runs (an index range on (schedule_id, id))."""
    runs = _durations(session.execute(_completed(session, schedule_id)).all())
    return ScheduleDurations(runs, duration_trend([r.seconds for r in runs]))


def _candidates(session: Session, end: datetime, narrowed: Sequence[ColumnElement[bool]], limit: int) -> list[int]:
    """The longest mean durations of the ``WINDOW`` before ``end``, then the means that grew most
    against the ``WINDOW`` before that (a schedule still fast but getting slower), each up to
    ``limit``: one aggregate over the two windows' index range (PostgreSQL walks (started_at, id))."""
    run = ScheduleExecution
    recent = run.started_at >= end - WINDOW
    means = (
        select(
            run.schedule_id.label("schedule_id"),
            func.avg(case((recent, _seconds(session)))).label("latest"),
            func.avg(case((~recent, _seconds(session)))).label("before"),
        )
        .where(
            run.status == ExecutionStatus.COMPLETED,
            run.started_at >= end - 2 * WINDOW,
            run.schedule_id.is_not(None),
            *narrowed,
        )
        .group_by(run.schedule_id)
        .cte("means")
    )
    longest = (
        select(means.c.schedule_id)
        .where(means.c.latest.is_not(None))
        .order_by(means.c.latest.desc(), means.c.schedule_id)
        .limit(limit)
    )
    grown = (
        select(means.c.schedule_id)
        .where(means.c.latest.is_not(None), means.c.before > 0)
        .order_by((means.c.latest / means.c.before).desc(), means.c.schedule_id)
        .limit(limit)
    )
    found = session.scalars(union_all(select(longest.subquery()), select(grown.subquery()))).all()
    return list(dict.fromkeys(found))


def trends_view(
    session: Session, now: datetime, wanted: RunFilter | None = None, limit: int = CANDIDATES
) -> TrendsView:
    """The Runs page's "slowest schedules" and "getting slower", of the runs ``wanted`` picks
    (its state and cursor aside)."""
    wanted = wanted or RunFilter()
    narrowed = _narrowed(wanted)
    end = min(now, wanted.until) if wanted.until is not None else now
    candidates = _candidates(session, end, narrowed, limit)
    if not candidates:
        return TrendsView()
    parts = [select(_completed(session, sid, narrowed).subquery()) for sid in candidates]
    statement = parts[0] if len(parts) == 1 else union_all(*parts)
    by_schedule: dict[int, list[Any]] = {}
    for row in session.execute(statement).all():
        by_schedule.setdefault(row[0], []).append(row)
    names = dict(session.execute(select(Schedule.id, Schedule.name).where(Schedule.id.in_(candidates))).all())
    trends = []
    for sid, rows in by_schedule.items():
        rows.sort(key=lambda r: r[1], reverse=True)
        trend = duration_trend([d.seconds for d in _durations(rows)])
        if sid in names and trend.p50 is not None:
            trends.append(ScheduleTrend(names[sid], trend))
    slowest = sorted(trends, key=lambda t: (-(t.trend.p50 or 0.0), t.name))[:LISTED]
    slower = sorted((t for t in trends if t.trend.slower), key=lambda t: (-(t.trend.ratio or 0.0), t.name))
    return TrendsView(slowest, slower[:LISTED], len(candidates))
