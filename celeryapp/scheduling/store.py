"""Schedules in the database: from and to definitions, lookups, and definition changes."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from celeryapp.domain.cadence import Cadence, cadence_of
from celeryapp.domain.definition import ScheduleDefinition
from celeryapp.domain.dst_rules import DstRules
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


def definition_values(definition: ScheduleDefinition) -> dict[str, Any]:
    """The ``schedules`` columns a definition is stored in (its steps apart): the one mapping both
    a single change (:func:`upsert_schedule`) and a file's bulk apply write."""
    return {
        "enabled": definition.enabled,
        "cron": definition.cron,
        "every_s": definition.every_s,
        "timezone": definition.timezone,
        "overlap": definition.overlap,
        "max_retries": definition.max_retries,
        "retry_delay_s": definition.retry_delay_s,
        "total_repeats": definition.total_repeats,
        "timeout_s": definition.timeout_s,
        "payload": dict(definition.payload),
        # Stored as the schedule object shows them: the deadline watch and the alert outbox read these.
        "deadlines": definition.deadlines.to_json() if definition.deadlines is not None else None,
        "alerts": definition.alerts.to_json() if definition.alerts is not None else None,
        "calendar": definition.calendar.to_json() if definition.calendar is not None else None,
        "catchup": definition.catchup.to_json() if definition.catchup is not None else None,
        "dst": definition.dst.to_json() if definition.dst is not None else None,
        "uses": [use.to_json() for use in definition.uses] or None,
    }


def step_values(definition: ScheduleDefinition) -> list[dict[str, Any]]:
    """The ``schedule_steps`` rows of a definition (its schedule's id apart)."""
    return [
        {
            "step_index": index,
            "position": position,
            "in_list": is_list,
            "name": step.name,
            "task": step.task,
            "args": list(step.args),
            "kwargs": dict(step.kwargs),
            "continue_on_failure": step.continue_on_failure,
            "timeout_s": step.timeout_s,
            "queue": step.queue,
            "max_attempts": step.max_attempts,
            "uses": [use.to_json() for use in step.uses] or None,
        }
        for index, (group, is_list) in enumerate(zip(definition.groups, definition.group_is_list, strict=True))
        for position, step in enumerate(group)
    ]


def changed_definition_values(
    definition: ScheduleDefinition, values: Mapping[str, Any], *, now: datetime, paused_by: str | None
) -> dict[str, Any]:
    """The columns a definition change resets beside the definition's ``values``.

    Status after a change: ``paused`` when the definition says ``enabled: false``, else ``active``
    (a changed definition revives a ``done`` or ``dead`` schedule and resets its retries).
    """
    enabled = definition.enabled
    # The cadence beat and the fire compute (anchored at updated_at, which is now).
    cadence = Cadence(
        cron=values["cron"],
        every_s=values["every_s"],
        timezone=values["timezone"],
        anchor=now,
        dst=DstRules.from_json(values["dst"]),
    )
    return {
        "status": ScheduleStatus.ACTIVE if enabled else ScheduleStatus.PAUSED,
        # A definition applied with ``enabled: false`` is paused by whoever applied it.
        "paused_by": None if enabled else paused_by,
        "paused_reason": None if enabled else "enabled: false in the definition",
        "paused_at": None if enabled else now,
        "current_retry": 0,
        "retry_at": None,
        "updated_at": now,
        "changed_at": now,
        "next_run_at": cadence.slot_after(now) if enabled else None,
        # A changed definition starts a new cadence: none of its slots was processed yet, and none
        # before now was missed.
        "last_slot_at": None,
    }


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
    names = _limit_names(definition)
    if names:
        check_definition_uses(definition, _known_limits(session, names, defined_beside, removed_beside))


def _limit_names(definition: ScheduleDefinition) -> set[str]:
    return {use.limit for use in definition.uses} | {
        use.limit for group in definition.groups for s in group for use in s.uses
    }


def _known_limits(
    session: Session, names: Collection[str], defined_beside: Sequence[LimitDefinition], removed_beside: Collection[str]
) -> dict[str, LimitDefinition]:
    known: dict[str, LimitDefinition] = {}
    listed = sorted(names)
    # Listed a thousand at a time: far below SQLite's 32,766 bound parameters.
    for start in range(0, len(listed), 1000):
        rows = session.scalars(select(LIMITS.c.definition).where(LIMITS.c.name.in_(listed[start : start + 1000])))
        known.update((limit.name, limit) for limit in map(parse_limit, rows) if limit.name not in removed_beside)
    known.update((limit.name, limit) for limit in defined_beside)
    return known


def check_file_limits_known(
    session: Session,
    definitions: Sequence[ScheduleDefinition],
    file_limits: Sequence[LimitDefinition],
    removed_limits: Collection[str],
) -> None:
    """:func:`check_limits_known` for a schedule file's definitions, with the limits the file
    defines and removes: every mistake of the file at once, each naming its schedule
    (``schedules[1] (sales).steps[0].uses[0]``). The limits they name are read at once."""
    used = [_limit_names(definition) for definition in definitions]
    known = _known_limits(session, set().union(*used), file_limits, removed_limits)
    problems = Problems()
    for index, (definition, names) in enumerate(zip(definitions, used, strict=True)):
        if names:
            problems.prefix = f"schedules[{index}] ({definition.name})."
            problems.check(check_definition_uses, definition, known)
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
    values = definition_values(definition)
    values |= changed_definition_values(definition, values, now=now, paused_by=paused_by)
    for column, value in values.items():
        setattr(schedule, column, value)
    schedule.steps = [ScheduleStep(**step) for step in step_values(definition)]
    schedule.source = source
    schedule.source_name = source_name
    schedule.version = (schedule.version or 0) + 1
    session.flush()
    record_version(session, schedule, definition.to_json(), origin, now=now)
    return schedule, change
