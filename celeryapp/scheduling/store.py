"""Schedules in the database: from and to definitions, lookups, and definition changes."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from celeryapp.domain.cadence import cadence_of
from celeryapp.domain.definition import ScheduleDefinition
from celeryapp.domain.pause_resume import Transition
from celeryapp.domain.problems import Problems
from celeryapp.domain.shared_limits import LimitDefinition, check_definition_uses, parse_limit
from celeryapp.errors import InvalidTransition, NotFound
from models import Schedule, ScheduleSource, ScheduleStatus, ScheduleStep
from models.definitions import definition_of
from models.limit_tables import LIMITS
from models.session import affected
from models.versions import VersionOrigin, record_version

#: Times a pause or resume decides again when the status changed between its read and its write.
STATUS_RACE_TRIES = 3


class Change(StrEnum):
    ADDED = "added"
    CHANGED = "changed"
    UNCHANGED = "unchanged"


def find_schedule(session: Session, name: str, *, lock: bool = False) -> Schedule:
    """The schedule called ``name``; with ``lock``, its row locked until commit (read and locked in
    one statement: see :func:`celeryapp.execution.runs.lock_schedule`)."""
    query = select(Schedule).where(Schedule.name == name)
    schedule = session.scalar(query.with_for_update() if lock else query)
    if schedule is None:
        raise NotFound(f"schedule {name!r} does not exist")
    return schedule


def change_status(
    session: Session,
    name: str,
    decide: Callable[[str, ScheduleStatus], Transition],
    *,
    now: datetime,
    also: dict[str, Any] | None = None,
) -> tuple[Schedule, bool]:
    """Pause or resume (``decide``) the schedule called ``name``: the status it decides on is
    written only where it is still the one read (compare-and-set), so a run that ends it ``done``
    or ``dead`` meanwhile is not overwritten; then it decides again on the new one. ``also``:
    columns written with the new status only (who paused it), not when nothing changes. Answers
    the schedule and whether this call wrote its status (False: it already had it)."""
    schedule = find_schedule(session, name)
    for _ in range(STATUS_RACE_TRIES):
        read = schedule.status
        transition = decide(name, read)
        if transition.refusal is not None:
            raise InvalidTransition(transition.refusal)
        if transition.to is None:
            return schedule, False
        changed = update(Schedule).where(Schedule.id == schedule.id, Schedule.status == read)
        values = {**_entering(schedule, transition.to, now), **(also or {})}
        if affected(session, changed.values(status=transition.to, changed_at=now, **values)):
            session.refresh(schedule)
            return schedule, True
        # Read again (an expired object is loaded afresh from the row); gone meanwhile: NotFound.
        session.expire(schedule)
        schedule = find_schedule(session, name)
    raise InvalidTransition(f"schedule {name!r} kept changing status; try again")


def _entering(schedule: Schedule, status: ScheduleStatus, now: datetime) -> dict[str, Any]:
    """What changes with the status a pause or resume writes, besides it."""
    if status is ScheduleStatus.PAUSED:
        # Pause is non-destructive but nothing is due while paused: no next run, retry or buffered run.
        return {"next_run_at": None, "retry_at": None, "buffered": False}
    # Resumed from the next slot: the paused ones were not missed (last_slot_at); they are in the
    # slot record as skipped_paused (recovery.paused_slots).
    return {
        "next_run_at": cadence_of(schedule).slot_after(now),
        "last_slot_at": None,
        "paused_by": None,
        "paused_reason": None,
        "paused_at": None,
    }


def _write_definition(schedule: Schedule, definition: ScheduleDefinition) -> None:
    schedule.enabled = definition.enabled
    schedule.cron = definition.cron
    schedule.every_s = definition.every_s
    schedule.timezone = definition.timezone
    schedule.overlap = definition.overlap
    schedule.max_retries = definition.max_retries
    schedule.retry_delay_s = definition.retry_delay_s
    schedule.total_repeats = definition.total_repeats
    schedule.timeout_s = definition.timeout_s
    schedule.payload = dict(definition.payload)
    # Stored as the schedule object shows them: the deadline watch and the alert outbox read these.
    schedule.deadlines = definition.deadlines.to_json() if definition.deadlines is not None else None
    schedule.alerts = definition.alerts.to_json() if definition.alerts is not None else None
    schedule.calendar = definition.calendar.to_json() if definition.calendar is not None else None
    schedule.catchup = definition.catchup.to_json() if definition.catchup is not None else None
    schedule.dst = definition.dst.to_json() if definition.dst is not None else None
    schedule.uses = [use.to_json() for use in definition.uses] or None
    schedule.steps = [
        ScheduleStep(
            step_index=index,
            position=position,
            in_list=is_list,
            name=step.name,
            task=step.task,
            args=list(step.args),
            kwargs=dict(step.kwargs),
            continue_on_failure=step.continue_on_failure,
            timeout_s=step.timeout_s,
            queue=step.queue,
            max_attempts=step.max_attempts,
            uses=[use.to_json() for use in step.uses] or None,
        )
        for index, (group, is_list) in enumerate(zip(definition.groups, definition.group_is_list, strict=True))
        for position, step in enumerate(group)
    ]


def check_limits_known(
    session: Session,
    definition: ScheduleDefinition,
    defined_beside: Sequence[LimitDefinition] = (),
    removed_beside: Collection[str] = (),
) -> None:
    """The limits the definition uses exist now, each with the slots asked for (a use that could
    never be admitted would wait for ever); checked as it is stored, each mistake naming its field.
    ``defined_beside`` and ``removed_beside``: the limits its schedule file defines (which win over
    the stored ones) and removes, which a dry run has not written."""
    names = {use.limit for use in definition.uses} | {
        use.limit for group in definition.groups for s in group for use in s.uses
    }
    if not names:
        return
    rows = session.scalars(select(LIMITS.c.definition).where(LIMITS.c.name.in_(names)))
    known = {limit.name: limit for limit in map(parse_limit, rows) if limit.name not in removed_beside}
    known.update((limit.name, limit) for limit in defined_beside)
    check_definition_uses(definition, known)


def check_file_limits_known(
    session: Session,
    definitions: Sequence[ScheduleDefinition],
    file_limits: Sequence[LimitDefinition],
    removed_limits: Collection[str],
) -> None:
    """:func:`check_limits_known` for a schedule file's definitions, with the limits the file
    defines and removes: every mistake of the file at once, each naming its schedule
    (``schedules[1] (sales).steps[0].uses[0]``)."""
    problems = Problems()
    for index, definition in enumerate(definitions):
        problems.prefix = f"schedules[{index}] ({definition.name})."
        problems.check(check_limits_known, session, definition, file_limits, removed_limits)
    problems.raise_any()


def upsert_schedule(
    session: Session,
    definition: ScheduleDefinition,
    *,
    source: ScheduleSource,
    now: datetime,
    origin: VersionOrigin,
    source_name: str | None = None,
    paused_by: str | None = None,
) -> tuple[Schedule, Change]:
    """Store a validated definition, replacing the stored one of the same name, as the schedule's
    next version (made by ``origin``; docs/versions.md).

    Status after a change: ``paused`` when the definition says ``enabled: false``, else ``active``
    (a changed definition revives a ``done`` or ``dead`` schedule and resets its retries). An
    unchanged definition leaves status and counters alone, so re-applying a file is a no-op.
    """
    # Locked before its steps are replaced: the schedule's row first, as everything that
    # changes a schedule or its runs takes it (docs/architecture.md, "Locks").
    locked = select(Schedule).where(Schedule.name == definition.name).with_for_update()
    # Read again as locked, even when the session holds it already (a file's apply read them all).
    schedule = session.scalar(locked.execution_options(populate_existing=True))
    if schedule is not None and definition_of(schedule) == definition:
        if schedule.source is not source or schedule.source_name != source_name:
            schedule.source = source
            schedule.source_name = source_name
        return schedule, Change.UNCHANGED
    check_limits_known(session, definition)
    change = Change.CHANGED
    if schedule is None:
        schedule = Schedule(
            name=definition.name, created_at=now, version=0, run_count=0, error_count=0, current_retry=0, buffered=False
        )
        session.add(schedule)
        change = Change.ADDED
    session.flush()
    # Steps are replaced wholesale: delete the old rows first so their unique names are free.
    schedule.steps = []
    session.flush()
    _write_definition(schedule, definition)
    schedule.source = source
    schedule.source_name = source_name
    schedule.status = ScheduleStatus.ACTIVE if definition.enabled else ScheduleStatus.PAUSED
    # A definition applied with ``enabled: false`` is paused by whoever applied it.
    schedule.paused_by = None if definition.enabled else paused_by
    schedule.paused_reason = None if definition.enabled else "enabled: false in the definition"
    schedule.paused_at = None if definition.enabled else now
    schedule.current_retry = 0
    schedule.retry_at = None
    schedule.version = (schedule.version or 0) + 1
    schedule.updated_at = now
    schedule.changed_at = now
    # The cadence beat and the fire compute (anchored at updated_at, which is now).
    schedule.next_run_at = cadence_of(schedule).slot_after(now) if definition.enabled else None
    # A changed definition starts a new cadence: none of its slots was processed yet, and none
    # before now was missed.
    schedule.last_slot_at = None
    session.flush()
    record_version(session, schedule, definition.to_json(), origin, now=now)
    return schedule, change
