"""Every run across schedules as the dashboard's Runs page lists it: newest first by start, filtered
by state, schedule, trigger and time, paged by the key (started_at, id) so a page deep in the
history reads a page of rows (each filter walks its own index: models/tables.py), never OFFSET."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from celeryapp.domain.limits import MAX_ID, short_repr
from celeryapp.domain.times import iso
from celeryapp.errors import InvalidArgument
from celeryapp.interfaces.arguments import choice_arg, name_arg
from celeryapp.interfaces.audit import instant_arg
from celeryapp.interfaces.web import trail
from celeryapp.interfaces.web.since_choices import since_time
from models import ExecutionStatus, Schedule, ScheduleExecution, Trigger

#: Runs one page shows; a full page links to the next.
PAGE_ROWS = 50
#: A failed run's error as the list shows it (the run's page has all of it).
ERROR_CHARS = 160
#: The query-string names of the filters, in the order a shared address lists them.
FILTER_NAMES = ("state", "schedule", "trigger", "since", "until")
STATES = tuple(s.value for s in ExecutionStatus)
TRIGGERS = tuple(t.value for t in Trigger)


@dataclass(frozen=True)
class RunFilter:
    """Which runs a reader wants, each part checked (``None``: any)."""

    state: ExecutionStatus | None = None
    schedule: str | None = None
    trigger: Trigger | None = None
    #: Runs started at or after ``since`` and before ``until`` (UTC).
    since: datetime | None = None
    until: datetime | None = None
    #: The cursor: only runs older, by (started_at, id), than this one.
    before_id: int | None = None


@dataclass(frozen=True)
class RunRow:
    id: int
    schedule: str
    #: The schedule's zone (the run's times are shown in it); UTC once the schedule is deleted.
    zone: str
    #: No schedule of that name any more (its runs are kept): nothing to link to.
    deleted: bool
    status: str
    warned: bool
    trigger: str
    started_at: datetime
    completed_at: datetime | None
    #: The nominal time the run is for; None for a manual run.
    slot: datetime | None
    error: str | None

    @property
    def lateness_s(self) -> float | None:
        """Started this long after its slot (negative: before it); None without a slot."""
        return None if self.slot is None else (self.started_at - self.slot).total_seconds()


@dataclass
class RunsView:
    rows: list[RunRow]
    #: The filters as given (for the form and the links), empty ones left out.
    given: dict[str, str] = field(default_factory=dict)
    wanted: RunFilter = field(default_factory=RunFilter)
    #: The run the next page starts before, when this page is full.
    next_before: int | None = None
    #: Why the filters were refused (naming the field), when they were.
    refused: str | None = None


def checked_run_filter(given: dict[str, str], before: str, now: datetime) -> RunFilter:
    """The query string's filters, checked; a refusal names the field as the address spells it.
    ``since`` may also be one of the form's lengths (``24h``: back from now)."""
    cursor = None
    if before:
        if not (before.isascii() and before.isdigit() and len(before) <= 12):
            raise InvalidArgument("before", f"must be a run id (digits), got {short_repr(before)}")
        cursor = int(before)
        if not 1 <= cursor <= MAX_ID:
            raise InvalidArgument("before", f"must be a run id between 1 and {MAX_ID}, got {cursor}")
    wanted = RunFilter(
        state=choice_arg(given.get("state"), ExecutionStatus, "state"),
        schedule=None if "schedule" not in given else name_arg(given["schedule"], "schedule"),
        trigger=choice_arg(given.get("trigger"), Trigger, "trigger"),
        since=instant_arg(since_time(given.get("since"), now), "since"),
        until=instant_arg(given.get("until"), "until"),
        before_id=cursor,
    )
    if wanted.since is not None and wanted.until is not None and wanted.until <= wanted.since:
        raise InvalidArgument("until", f"must be after since ({iso(wanted.since)}), got {iso(wanted.until)}")
    return wanted


def runs_view(session: Session, wanted: RunFilter, given: dict[str, str]) -> RunsView:
    """One page of runs, newest first; a cursor whose run is gone (housekeeping deleted it) is
    refused, as its place in the history is no longer known."""
    run = ScheduleExecution
    query = (
        select(
            run.id,
            run.schedule_name,
            run.status,
            run.trigger,
            run.started_at,
            run.completed_at,
            run.slot,
            func.substr(run.error, 1, ERROR_CHARS),
        )
        .order_by(run.started_at.desc(), run.id.desc())
        .limit(PAGE_ROWS)
    )
    if wanted.state is not None:
        query = query.where(run.status == wanted.state)
    if wanted.schedule is not None:
        query = query.where(run.schedule_name == wanted.schedule)
    if wanted.trigger is not None:
        query = query.where(run.trigger == wanted.trigger)
    if wanted.since is not None:
        query = query.where(run.started_at >= wanted.since)
    if wanted.until is not None:
        query = query.where(run.started_at < wanted.until)
    if wanted.before_id is not None:
        at = session.scalar(select(run.started_at).where(run.id == wanted.before_id))
        if at is None:
            refused = f"before: run #{wanted.before_id} is no longer kept; start again from the newest"
            return RunsView([], given, wanted, refused=refused)
        # Spelled so that started_at <= at bounds the walk of whichever index the filter uses.
        query = query.where(run.started_at <= at, or_(run.started_at < at, run.id < wanted.before_id))
    found = session.execute(query).all()
    names = {r[1] for r in found}
    zones: dict[str, str] = (
        dict(session.execute(select(Schedule.name, Schedule.timezone).where(Schedule.name.in_(names))).all())  # type: ignore[arg-type]
        if names
        else {}
    )
    warned = trail.warned_runs(session, [r[0] for r in found])
    rows = [
        RunRow(
            id=run_id,
            schedule=name,
            zone=zones.get(name, "UTC"),
            deleted=name not in zones,
            status=ExecutionStatus(status).value,
            warned=run_id in warned,
            trigger=Trigger(trigger).value,
            started_at=started,
            completed_at=completed,
            slot=slot,
            error=error,
        )
        for run_id, name, status, trigger, started, completed, slot, error in found
    ]
    full = len(rows) == PAGE_ROWS
    return RunsView(rows, given, wanted, rows[-1].id if full else None)
