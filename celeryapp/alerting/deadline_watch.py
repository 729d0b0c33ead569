"""The deadline watch: slots whose run is late, runs predicted late, slots beat never fired.

Called every ``CHORDBEAT_ALERT_WATCH_INTERVAL`` by the worker holding the alert sender's lease,
with the reference clock's ``now``. A pass reads (in one read-only transaction) the active
schedules that have an ``alerts`` object, the runs in progress of those with deadlines, and
which of the alerts it would raise exist already; then writes each new alert in a transaction of
its own that first locks the schedule's row and checks again what the alert says: a run ending
takes the same lock (runs.finish_execution), so it either ended before (no ``late``) or sees the
``late`` alert and raises ``resolved``; a fire claiming the slot takes it too, so a slot fired
meanwhile is not reported unfired.

Slots with no run are found from the cadence, not from beat: the slots from the schedule's
``next_run_at`` (the first one beat has not fired) to now. Slots before it were fired or recorded
skipped, missed or paused. So a deadline passing while beat or every worker is down is reported
by the first pass after a worker is back. A slot on a day the schedule's business calendar excludes
is expected to run nowhere, so it is never reported (beat down over a holiday pages nobody); a
calendar that cannot be read is logged and the slots reported as without one: better a page than
silence. Work is bounded: at most :data:`SLOTS_PER_PASS` slots per schedule and kind, within the
schedule's deadlines' reach plus :data:`LOOKBACK_MARGIN_S`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import String, cast, select
from sqlalchemy.orm import Session

from celeryapp.domain import deadlines
from celeryapp.domain.cadence import cadence_of
from celeryapp.domain.calendars import Calendar, CalendarError, slot_excluded
from celeryapp.domain.definition import CalendarRules
from celeryapp.domain.times import iso
from celeryapp.errors import ConfigError
from celeryapp.monitoring.alert_outbox import alert_key, raise_alert
from celeryapp.scheduling.calendar_files import schedule_calendar
from celeryapp.variables import DEFAULT_ALERT_MISSED_GRACE_S
from models import AlertKind, ExecutionStatus, Schedule, ScheduleExecution, ScheduleStatus, Trigger, transaction
from models.alert_tables import ALERTS
from models.session import retried_transaction
from models.tables import SLOT_RECORDS

logger = logging.getLogger(__name__)

#: Slots with no run one pass reports per schedule and kind at most (the newest); older ones were
#: reported by earlier passes, or, after a long outage, are summed up by beat's ``missed`` records.
SLOTS_PER_PASS = 5
#: Slots are looked for this far back beyond the reach of a schedule's deadlines, so that a pass
#: delayed (no worker held the sender's lease) still reports a deadline that passed meanwhile.
LOOKBACK_MARGIN_S = 3600.0
#: Keys asked about in one statement (far below SQLite's bound on parameters).
_KEYS_CHUNK = 500

_WATCHED = (
    select(
        Schedule.id,
        Schedule.name,
        Schedule.cron,
        Schedule.every_s,
        Schedule.timezone,
        Schedule.updated_at,
        Schedule.next_run_at,
        Schedule.retry_at,
        Schedule.deadlines,
        Schedule.alerts,
        Schedule.calendar,
        Schedule.dst,
    )
    # An ``alerts`` object written as None is stored as JSON null, not SQL NULL.
    .where(Schedule.status == ScheduleStatus.ACTIVE, cast(Schedule.alerts, String) != "null")
)
_SLOT_TRIGGERS = (Trigger.CRON, Trigger.INTERVAL)


@dataclass
class _Alert:
    """An alert a pass would raise, and what its transaction checks first."""

    schedule_id: int
    kind: AlertKind
    values: dict[str, Any]
    config: dict[str, Any]
    #: Raised only if this run is still in progress (a run's late alerts).
    run_id: int | None = None
    #: Raised only if the schedule's next_run_at is still at or before this slot (no run for it).
    unfired: datetime | None = None
    key: str = field(init=False)

    def __post_init__(self) -> None:
        v = self.values
        self.key = alert_key(
            self.kind, v["schedule_name"], slot_at=v["slot_at"], execution_id=v.get("execution_id"), detail=v["detail"]
        )


@dataclass(frozen=True)
class _Run:
    id: int
    schedule_id: int
    started_at: datetime
    slot: datetime


def watch(
    database_url: str,
    now: datetime,
    *,
    missed_grace_s: float = DEFAULT_ALERT_MISSED_GRACE_S,
    calendars_dir: str | None = None,
) -> int:
    """Raise the alerts whose deadline passed by ``now`` (the reference clock's); how many were
    raised. ``missed_grace_s``: how long past its slot a schedule beat has not fired is reported
    ``missed`` (``CHORDBEAT_ALERT_MISSED_GRACE``); ``calendars_dir``: where the named business
    calendars are (``CHORDBEAT_CALENDARS_DIR``)."""
    with transaction(database_url, read_only=True) as session:
        wanted = _decide(session, now, missed_grace_s, calendars_dir)
    raised = sum(_raise(database_url, alert, now) for alert in wanted)
    if raised:
        logger.info("deadline watch raised %d alert(s)", raised)
    return raised


def _decide(session: Session, now: datetime, missed_grace_s: float, calendars_dir: str | None) -> list[_Alert]:
    schedules = [row for row in session.execute(_WATCHED) if row.alerts]
    wanted: list[_Alert] = []
    late_ids = set()
    for row in schedules:
        on = set(row.alerts.get("on", ()))
        calendar = _calendar(row, calendars_dir) if on & {AlertKind.MISSED.value, AlertKind.LATE.value} else None
        if AlertKind.MISSED.value in on:
            wanted.extend(_not_fired(row, now, missed_grace_s, calendar))
        if AlertKind.LATE.value in on and row.deadlines:
            wanted.extend(_no_run(row, now, calendar))
            late_ids.add(row.id)
    runs = _runs_in_progress(session, late_ids)
    by_id = {row.id: row for row in schedules}
    for run in runs:
        wanted.extend(_late_run(by_id[run.schedule_id], run, now))
    raised = _existing(session, [alert.key for alert in wanted])
    wanted = [alert for alert in wanted if alert.key not in raised]
    # Predicting costs a statement per run: only for runs not reported yet.
    reported = raised | {alert.key for alert in wanted}
    for run in runs:
        row = by_id[run.schedule_id]
        if _key(row.name, "predicted", run.slot) not in reported and _key(row.name, "finish", run.slot) not in reported:
            wanted.extend(_predicted(session, row, run, now))
    return wanted


def _key(name: str, detail: str, slot: datetime) -> str:
    return alert_key(AlertKind.LATE, name, slot_at=slot, detail=detail)


def _calendar(row: Any, directory: str | None) -> Calendar | None:
    """The days the schedule's calendar excludes; ``None`` without one, or when it cannot be read
    (logged: its slots are then reported as if it had none)."""
    rules = CalendarRules.from_json(row.calendar)
    if rules is None:
        return None
    try:
        return schedule_calendar(directory, rules)
    except (CalendarError, ConfigError) as exc:
        logger.error(
            "deadline watch: %s: its calendar cannot be read, its slots are watched as if all ran: %s", row.name, exc
        )
        return None


def _not_fired(row: Any, now: datetime, grace_s: float, calendar: Calendar | None) -> Iterable[_Alert]:
    """``missed`` for the first slot beat should have fired more than the grace ago, on a day its
    calendar does not exclude. While a retry is pending it replaces the cadence, and beat fires
    that instead."""
    if row.next_run_at is None or row.retry_at is not None:
        return []
    until = now - timedelta(seconds=grace_s)
    slot = deadlines.first_running_slot(cadence_of(row), row.next_run_at, until=until, calendar=calendar)
    if slot is None or slot == until:
        return []
    ago_s = int((now - slot).total_seconds())
    message = f"{row.name}: the slot of {_when(slot)} has not fired {ago_s} s later: are beat and the workers up?"
    values = {"schedule_name": row.name, "message": message, "slot_at": slot, "detail": "not_fired"}
    return [_Alert(row.id, AlertKind.MISSED, values, row.alerts, unfired=slot)]


def _no_run(row: Any, now: datetime, calendar: Calendar | None) -> Iterable[_Alert]:
    """``late`` for the newest slots beat has not fired whose start or finish deadline passed,
    on days the calendar does not exclude."""
    first = row.next_run_at
    if first is None or row.retry_at is not None:
        return []
    d = row.deadlines
    start_s, finish_s, by = d.get("start_within"), d.get("finish_within"), d.get("finish_by")
    reach_s = deadlines.longest_s(start_s, finish_s, by) + LOOKBACK_MARGIN_S
    since = max(first, now - timedelta(seconds=reach_s))
    cadence = cadence_of(row)
    zone = ZoneInfo(row.timezone)

    def expected(slots: list[datetime]) -> list[datetime]:
        return [slot for slot in slots if calendar is None or slot_excluded(slot, zone, calendar) is None]

    found = []
    if start_s is not None:
        for slot in expected(
            deadlines.newest_slots(cadence, since=since, until=now - timedelta(seconds=start_s), cap=SLOTS_PER_PASS)
        ):
            deadline = deadlines.start_deadline(slot, start_s)
            message = f"{row.name}: the slot of {_when(slot)} has not started a run by {_when(deadline)}"
            found.append(_late(row, "start", slot, message))
    due = deadlines.last_slot_due(now, finish_within_s=finish_s, finish_by=by, zone=row.timezone)
    if due is not None:
        for slot in expected(deadlines.newest_slots(cadence, since=since, until=due, cap=SLOTS_PER_PASS)):
            deadline = _finish_deadline(row, slot)
            message = f"{row.name}: the slot of {_when(slot)} has no run and had to finish by {_when(deadline)}"
            found.append(_late(row, "finish", slot, message))
    return found


def _late(row: Any, detail: str, slot: datetime, message: str, **more: Any) -> _Alert:
    values = {"schedule_name": row.name, "message": message, "slot_at": slot, "detail": detail, **more}
    run_id = more.get("execution_id")
    return _Alert(row.id, AlertKind.LATE, values, row.alerts, run_id=run_id, unfired=None if run_id else slot)


def _finish_deadline(row: Any, slot: datetime) -> datetime | None:
    d = row.deadlines
    return deadlines.finish_deadline(
        slot, finish_within_s=d.get("finish_within"), finish_by=d.get("finish_by"), zone=row.timezone
    )


def _runs_in_progress(session: Session, schedule_ids: set[int]) -> list[_Run]:
    """The runs in progress of these schedules that a regular slot started. All runs in progress
    are read (through the index on (status, started_at), and the slot records' on execution_id):
    they are few, as many as run at once, where the schedules with deadlines may be thousands."""
    if not schedule_ids:
        return []
    found = session.execute(
        select(
            ScheduleExecution.id,
            ScheduleExecution.schedule_id,
            ScheduleExecution.started_at,
            SLOT_RECORDS.c.nominal_at,
        )
        .join(SLOT_RECORDS, SLOT_RECORDS.c.execution_id == ScheduleExecution.id)
        .where(
            ScheduleExecution.status == ExecutionStatus.IN_PROGRESS,
            ScheduleExecution.trigger.in_(_SLOT_TRIGGERS),
            SLOT_RECORDS.c.nominal_at.is_not(None),
        )
    )
    return [_Run(*row) for row in found if row.schedule_id in schedule_ids]


def _late_run(row: Any, run: _Run, now: datetime) -> Iterable[_Alert]:
    """``late`` for a run in progress that started after its start deadline or is running past
    its finish deadline."""
    found = []
    start = deadlines.start_deadline(run.slot, row.deadlines.get("start_within"))
    common = {"execution_id": run.id}
    what = f"{row.name}: run {run.id} of the slot of {_when(run.slot)}"
    if start is not None and run.started_at > start:
        message = f"{what} started at {_when(run.started_at)}, after its start deadline {_when(start)}"
        found.append(_late(row, "start", run.slot, message, **common))
    finish = _finish_deadline(row, run.slot)
    if finish is not None and finish <= now:
        message = f"{what} is still running at its finish deadline {_when(finish)}"
        found.append(_late(row, "finish", run.slot, message, **common))
    return found


def _predicted(session: Session, row: Any, run: _Run, now: datetime) -> Iterable[_Alert]:
    """``late`` (predicted) for a run expected, from the schedule's recent runs, to end after its
    finish deadline, before that deadline passes."""
    finish = _finish_deadline(row, run.slot)
    if finish is None or finish <= now:
        return []
    recent = session.execute(
        select(ScheduleExecution.started_at, ScheduleExecution.completed_at)
        .where(
            ScheduleExecution.schedule_id == run.schedule_id,
            ScheduleExecution.status == ExecutionStatus.COMPLETED,
        )
        .order_by(ScheduleExecution.id.desc())
        .limit(deadlines.RECENT_RUNS)
    ).all()
    durations = [(ended - began).total_seconds() for began, ended in recent if ended is not None]
    expected = deadlines.expected_finish(run.started_at, now, durations)
    if expected is None or expected <= finish:
        return []
    message = (
        f"{row.name}: run {run.id} of the slot of {_when(run.slot)} is expected to finish at {_when(expected)}, "
        f"after its finish deadline {_when(finish)} (from the last {len(durations)} completed runs)"
    )
    return [_late(row, "predicted", run.slot, message, execution_id=run.id, expected_at=expected)]


def _existing(session: Session, keys: list[str]) -> set[str]:
    found: set[str] = set()
    for start in range(0, len(keys), _KEYS_CHUNK):
        chunk = keys[start : start + _KEYS_CHUNK]
        found.update(session.scalars(select(ALERTS.c.key).where(ALERTS.c.key.in_(chunk))))
    return found


def _raise(database_url: str, alert: _Alert, now: datetime) -> int:
    """1 if the alert was written; in its own transaction, under the schedule's row lock."""

    def work(session: Session) -> int:
        locked = session.execute(
            select(Schedule.status, Schedule.next_run_at).where(Schedule.id == alert.schedule_id).with_for_update()
        ).first()
        if locked is None or locked.status is not ScheduleStatus.ACTIVE:
            return 0  # deleted or paused meanwhile
        if alert.unfired is not None and (locked.next_run_at is None or locked.next_run_at > alert.unfired):
            return 0  # beat fired (or recorded) the slot meanwhile
        if alert.run_id is not None:
            status = session.scalar(select(ScheduleExecution.status).where(ScheduleExecution.id == alert.run_id))
            if status is not ExecutionStatus.IN_PROGRESS:
                return 0  # ended meanwhile: nothing late to resolve
        written = raise_alert(session, kind=alert.kind, now=now, config=alert.config, **alert.values)
        return 0 if written is None else 1

    return retried_transaction(database_url, f"raising alert {alert.key}", work)


def _when(instant: datetime | None) -> str:
    return iso(instant, timespec="seconds") or "?"
