"""What the dashboard's pages show, read from the database in a few bounded queries per page.

Every list is paginated or limited; per-row details (a schedule's last runs, a run's steps) are
fetched for the whole page at once, never row by row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import func, select, union_all
from sqlalchemy.orm import Session, raiseload

from celeryapp.domain.cadence import next_fire_times
from celeryapp.domain.dst_rules import DstRules
from celeryapp.domain.times import parse_time
from celeryapp.execution.reruns import first_failed_group
from celeryapp.interfaces.display import step_states
from celeryapp.interfaces.dst_notes import dst_notes
from celeryapp.interfaces.objects import execution_json
from celeryapp.interfaces.run_counts import RunCounts, run_counts
from celeryapp.interfaces.web import trail
from models import (
    Activity,
    ExecutionStatus,
    Schedule,
    ScheduleExecution,
    ScheduleStatus,
    SlotRecord,
    WorkerTask,
    WorkerTaskStatus,
)
from models.tables import RECOVERED_ATTEMPT

#: Schedules per page of the list.
PAGE_SIZE = 50
#: Runs in a schedule's history strip (list) and in its runs-by-steps grid (schedule page).
STRIP_RUNS = 12
GRID_RUNS = 20
SLOTS_SHOWN = 20
UPCOMING = 10
#: A queued step not picked up for this long, or a run with nothing open, looks stuck.
STUCK_QUEUED = timedelta(minutes=10)


@dataclass(frozen=True)
class RunMark:
    id: int
    status: str
    started_at: datetime
    completed_at: datetime | None
    #: A step warned or failed with continue_on_failure: a completed run shows "with warnings".
    warned: bool = False


@dataclass
class ScheduleRow:
    schedule: Schedule
    runs: list[RunMark] = field(default_factory=list)  # newest first

    @property
    def next_at(self) -> datetime | None:
        return self.schedule.retry_at or self.schedule.next_run_at


def _recent_runs(session: Session, schedule_ids: Sequence[int], per_schedule: int) -> dict[int, list[RunMark]]:
    """The last runs of each schedule, newest first, in one statement: one index range per
    schedule (schedule_id, id) instead of a window over every run of every schedule."""
    if not schedule_ids:
        return {}
    columns = (
        ScheduleExecution.schedule_id,
        ScheduleExecution.id,
        ScheduleExecution.status,
        ScheduleExecution.started_at,
        ScheduleExecution.completed_at,
    )
    parts: list[Any] = [
        select(*columns)
        .where(ScheduleExecution.schedule_id == sid)
        .order_by(ScheduleExecution.id.desc())
        .limit(per_schedule)
        for sid in schedule_ids
    ]
    wrapped = [select(part.subquery()) for part in parts]
    statement = wrapped[0] if len(wrapped) == 1 else union_all(*wrapped)
    found = session.execute(statement).all()
    warned = trail.warned_runs(session, [row[1] for row in found])
    runs: dict[int, list[RunMark]] = {sid: [] for sid in schedule_ids}
    for sid, run_id, status, started, completed in found:
        runs[sid].append(RunMark(run_id, ExecutionStatus(status).value, started, completed, run_id in warned))
    for marks in runs.values():
        marks.sort(key=lambda m: m.id, reverse=True)
    return runs


def schedule_page(
    session: Session, *, search: str = "", status: str = "", page: int = 1
) -> tuple[list[ScheduleRow], int]:
    """One page of schedules by name, and how many match."""
    query = select(Schedule).options(raiseload(Schedule.steps))
    count = select(func.count()).select_from(Schedule)
    if search:
        pattern = "%" + search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        condition = Schedule.name.ilike(pattern, escape="\\")
        query, count = query.where(condition), count.where(condition)
    if status in {s.value for s in ScheduleStatus}:
        query, count = query.where(Schedule.status == status), count.where(Schedule.status == status)
    total = session.scalar(count) or 0
    schedules = session.scalars(query.order_by(Schedule.name).limit(PAGE_SIZE).offset((page - 1) * PAGE_SIZE)).all()
    runs = _recent_runs(session, [s.id for s in schedules], STRIP_RUNS)
    return [ScheduleRow(s, runs[s.id]) for s in schedules], total


@dataclass
class GridCell:
    state: str
    attempts: int


@dataclass
class ScheduleView:
    schedule: Schedule
    groups: list[list[Any]]  # ScheduleStep rows by group
    runs: list[ScheduleExecution]  # oldest first
    steps: list[tuple[int, str]]  # grid rows: (group, step)
    cells: dict[tuple[int, tuple[int, str]], GridCell]
    slots: list[SlotRecord]
    upcoming: list[datetime]
    #: Per upcoming time, what the schedule's DST rule did to it on a day the clocks change.
    upcoming_dst: list[str | None]
    counts: RunCounts
    audit: list[dict[str, Any]]
    #: Runs of the grid with a step that warned.
    warned: set[int]
    #: Runs of the grid whose definition version differs from the run before them (the grid marks them).
    version_starts: set[int] = field(default_factory=set)


def schedule_view(session: Session, name: str, now: datetime, whole: bool = True) -> ScheduleView | None:
    """The schedule page; only its live part when not ``whole``."""
    schedule = session.scalar(select(Schedule).where(Schedule.name == name))
    if schedule is None:
        return None
    groups: dict[int, list[Any]] = {}
    for step in schedule.steps:
        groups.setdefault(step.step_index, []).append(step)
    runs = list(
        session.scalars(
            select(ScheduleExecution)
            .where(ScheduleExecution.schedule_id == schedule.id)
            .order_by(ScheduleExecution.id.desc())
            .limit(GRID_RUNS)
        ).all()
    )[::-1]
    ids = [r.id for r in runs]
    steps: dict[tuple[int, str], None] = {(s.step_index, s.name): None for s in schedule.steps}
    cells: dict[tuple[int, tuple[int, str]], GridCell] = {}
    if ids:
        activities = session.execute(
            select(Activity.execution_id, Activity.step_index, Activity.step_name, Activity.status, Activity.attempt)
            .where(Activity.execution_id.in_(ids))
            .order_by(Activity.execution_id, Activity.step_index, Activity.attempt)
        ).all()
        tasks = session.execute(
            select(WorkerTask.execution_id, WorkerTask.step_index, WorkerTask.step_name, WorkerTask.status).where(
                WorkerTask.execution_id.in_(ids)
            )
        ).all()
        for run_id, index, step_name, done, attempt in activities:
            steps.setdefault((index, step_name), None)
            cells[(run_id, (index, step_name))] = GridCell(done.value, attempt)
        for run_id, index, step_name, open_state in tasks:
            steps.setdefault((index, step_name), None)
            cell = cells.get((run_id, (index, step_name)))
            # A processing task's running attempt already shows as its in-progress activity.
            if cell is None or cell.state != "in_progress":
                cells[(run_id, (index, step_name))] = GridCell(open_state.value, cell.attempts if cell else 0)
    slots = list(
        session.scalars(
            select(SlotRecord).where(SlotRecord.schedule_name == name).order_by(SlotRecord.id.desc()).limit(SLOTS_SHOWN)
        ).all()
    )
    upcoming = next_fire_times(schedule, now, UPCOMING)
    return ScheduleView(
        schedule=schedule,
        groups=[groups[i] for i in sorted(groups)],
        runs=runs,
        steps=sorted(steps, key=lambda s: s[0]),
        cells=cells,
        slots=slots,
        upcoming=upcoming,
        upcoming_dst=dst_notes(
            schedule.cron, ZoneInfo(schedule.timezone), DstRules.from_json(schedule.dst), now, upcoming
        ),
        # The header and the trail are outside the live part: the refresh does not count again.
        counts=run_counts(session, schedule.id) if whole else RunCounts(),
        audit=trail.audit_trail(session, schedule=name) if whole else [],
        warned={run_id for (run_id, _), cell in cells.items() if cell.state in trail.WARNING_STEPS},
        version_starts={later.id for earlier, later in pairwise(runs) if later.version != earlier.version},
    )


@dataclass
class Bar:
    attempt: int
    state: str
    left: float  # percent of the run's span
    width: float
    started_at: datetime
    completed_at: datetime | None
    worker: str | None


@dataclass
class StepLine:
    group: int
    name: str
    state: str
    attempt: int
    bars: list[Bar]
    activities: list[dict[str, Any]]


@dataclass
class ExecutionView:
    execution: ScheduleExecution
    data: dict[str, Any]  # the contract's execution object
    lines: list[StepLine]
    span_s: float
    #: The schedule's zone (UTC once the schedule is deleted): the page's times are in it.
    zone: str
    #: Who did what to this run, newest first; the cancel's row when it was cancelled.
    audit: list[dict[str, Any]]
    cancelled_by: dict[str, Any] | None
    #: Re-runs started from this run.
    reruns: list[int]
    #: Where a re-run from the failed group starts (0-based).
    failed_group: int


def execution_view(session: Session, execution_id: int, now: datetime) -> ExecutionView | None:
    execution = session.get(ScheduleExecution, execution_id)
    if execution is None:
        return None
    data = execution_json(session, execution)
    start = execution.started_at
    end = execution.completed_at or now
    for a in data["activities"]:
        a["_started"] = parse_time(a["started_at"])
        a["_completed"] = parse_time(a["completed_at"])
        if a["_completed"] and a["_completed"] > end:
            end = a["_completed"]
    span = max((end - start).total_seconds(), 0.001)
    states = step_states(data)
    lines: list[StepLine] = []
    for index, group in enumerate(execution.plan):
        for step in group:
            name = step["name"]
            attempts = [a for a in data["activities"] if a["step_index"] == index and a["step"] == name]
            bars = []
            for a in attempts:
                left = (a["_started"] - start).total_seconds() / span * 100
                right = ((a["_completed"] or now) - start).total_seconds() / span * 100
                bars.append(
                    Bar(
                        a["attempt"],
                        a["status"],
                        max(0.0, min(left, 99.5)),
                        max(0.5, min(right, 100.0) - max(left, 0.0)),
                        a["_started"],
                        a["_completed"],
                        a["worker"],
                    )
                )
            state, attempt = states.get((index, name), ("not_started", 0))
            lines.append(StepLine(index, name, state, attempt, bars, attempts))
    audit = trail.audit_trail(session, execution_id=execution.id)
    zone = session.scalar(select(Schedule.timezone).where(Schedule.id == execution.schedule_id))
    return ExecutionView(
        execution,
        data,
        lines,
        span,
        zone=zone or "UTC",
        audit=audit,
        cancelled_by=trail.cancel_of(audit),
        reruns=trail.reruns_of(session, execution),
        failed_group=first_failed_group(execution),
    )


@dataclass
class HealthView:
    running: list[
        tuple[str | None, int, str, str, int, datetime | None]
    ]  # node, execution, schedule, step, attempt, since
    recoveries: list[tuple[int, int, str, str, int, str | None, datetime | None]]
    stuck: list[tuple[int, str, datetime, str]]
    in_progress: int


def health_view(session: Session, now: datetime) -> HealthView:
    running = [
        (node, execution_id, schedule, step, attempt, since)
        for node, execution_id, schedule, step, attempt, since in session.execute(
            select(
                WorkerTask.node,
                WorkerTask.execution_id,
                ScheduleExecution.schedule_name,
                WorkerTask.step_name,
                WorkerTask.attempt,
                WorkerTask.started_at,
            )
            .join(ScheduleExecution, ScheduleExecution.id == WorkerTask.execution_id)
            .where(WorkerTask.status == WorkerTaskStatus.PROCESSING)
            .order_by(WorkerTask.node, WorkerTask.id)
            .limit(500)
        ).all()
    ]
    recoveries = list(
        session.execute(
            select(
                Activity.execution_id,
                Activity.id,
                ScheduleExecution.schedule_name,
                Activity.step_name,
                Activity.attempt,
                Activity.error,
                Activity.completed_at,
            )
            .join(ScheduleExecution, ScheduleExecution.id == Activity.execution_id)
            .where(RECOVERED_ATTEMPT)
            .order_by(Activity.id.desc())
            .limit(20)
        ).all()
    )
    in_progress = (
        session.scalar(
            select(func.count())
            .select_from(ScheduleExecution)
            .where(ScheduleExecution.status == ExecutionStatus.IN_PROGRESS)
        )
        or 0
    )
    return HealthView(running, recoveries, _stuck(session, now), in_progress)  # type: ignore[arg-type]


def _stuck(session: Session, now: datetime) -> list[tuple[int, str, datetime, str]]:
    """In-progress runs that look stuck: past their deadline, a step queued for long, or nothing open."""
    found: dict[int, tuple[int, str, datetime, str]] = {}
    overdue = session.execute(
        select(ScheduleExecution.id, ScheduleExecution.schedule_name, ScheduleExecution.started_at)
        .where(ScheduleExecution.status == ExecutionStatus.IN_PROGRESS, ScheduleExecution.deadline_at < now)
        .limit(20)
    ).all()
    for run_id, name, started in overdue:
        found[run_id] = (run_id, name, started, "past its timeout")
    queued = session.execute(
        select(
            ScheduleExecution.id, ScheduleExecution.schedule_name, ScheduleExecution.started_at, WorkerTask.step_name
        )
        .join(WorkerTask, WorkerTask.execution_id == ScheduleExecution.id)
        .where(WorkerTask.status == WorkerTaskStatus.QUEUED, WorkerTask.queued_at < now - STUCK_QUEUED)
        .limit(20)
    ).all()
    for run_id, name, started, step in queued:
        found.setdefault(
            run_id, (run_id, name, started, f"step {step!r} queued for over {STUCK_QUEUED.seconds // 60} min")
        )
    open_tasks = select(WorkerTask.id).where(WorkerTask.execution_id == ScheduleExecution.id).exists()
    orphans = session.execute(
        select(ScheduleExecution.id, ScheduleExecution.schedule_name, ScheduleExecution.started_at)
        .where(
            ScheduleExecution.status == ExecutionStatus.IN_PROGRESS,
            ScheduleExecution.started_at < now - STUCK_QUEUED,
            ~open_tasks,
        )
        .limit(20)
    ).all()
    for run_id, name, started in orphans:
        found.setdefault(run_id, (run_id, name, started, "in progress with no step open"))
    return sorted(found.values())[:20]
