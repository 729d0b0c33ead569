"""A schedule file's schedules read and written in bulk: the stored ones it names read in a few
statements, and what changed written as multi-row statements, in the apply's one transaction.

One ORM upsert per schedule sent six statements and built an object graph per schedule (10 ms a
schedule: docs/scaling.md, "The apply's cost"). The rows written are the ones a single change
writes (:func:`celeryapp.scheduling.store.upsert_schedule`: the same column mappings), so a
schedule applied from a file is stored as if it had been applied alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Table, bindparam, delete, insert, select, update
from sqlalchemy.orm import Session

from celeryapp.domain.definition import ScheduleDefinition
from celeryapp.scheduling.beat_entries import chunks
from celeryapp.scheduling.store import changed_definition_values, definition_values, step_values
from models import Schedule, ScheduleSource, ScheduleStep
from models.definitions import definition_from
from models.version_tables import SCHEDULE_VERSIONS
from models.versions import VersionOrigin, version_values

SCHEDULES = cast(Table, Schedule.__table__)
STEPS = cast(Table, ScheduleStep.__table__)


@dataclass(frozen=True)
class StoredSchedule:
    """A stored schedule a file names: what its apply compares and writes."""

    id: int
    name: str
    source: ScheduleSource
    source_name: str | None
    version: int
    definition: ScheduleDefinition


@dataclass
class FileWrites:
    """What a file's apply writes: schedules to add, to change (their stored row and new
    definition), and unchanged ones the file takes over (their owner only)."""

    added: list[ScheduleDefinition] = field(default_factory=list)
    changed: list[tuple[StoredSchedule, ScheduleDefinition]] = field(default_factory=list)
    taken: list[StoredSchedule] = field(default_factory=list)


def read_stored(session: Session, names: Sequence[str], *, lock: bool) -> dict[str, StoredSchedule]:
    """The stored schedules among ``names``, with their definitions: per :data:`CHUNK` names one
    statement for the schedules and one for their steps. With ``lock``, their rows are locked
    until commit (in id order), as a single change locks its schedule's before it compares."""
    found: dict[str, StoredSchedule] = {}
    for chunk in chunks(names):
        query = select(SCHEDULES).where(SCHEDULES.c.name.in_(chunk)).order_by(SCHEDULES.c.id)
        rows = session.execute(query.with_for_update() if lock else query).all()
        if not rows:
            continue
        steps: dict[int, list[Any]] = {row.id: [] for row in rows}
        step_query = select(STEPS).where(STEPS.c.schedule_id.in_(list(steps)))
        for step in session.execute(step_query):
            steps[step.schedule_id].append(step)
        for row in rows:
            definition = definition_from(row, steps[row.id])
            found[row.name] = StoredSchedule(row.id, row.name, row.source, row.source_name, row.version, definition)
    return found


def source_schedules(session: Session, source: str) -> dict[str, int]:
    """The schedules the file source ``source`` declared: name -> id."""
    query = select(SCHEDULES.c.name, SCHEDULES.c.id).where(
        SCHEDULES.c.source == ScheduleSource.FILE, SCHEDULES.c.source_name == source
    )
    return {name: schedule_id for name, schedule_id in session.execute(query)}


def write_definitions(
    session: Session, writes: FileWrites, *, source: str, origin: VersionOrigin, now: datetime
) -> None:
    """Write a file's changes: new schedules, changed ones (steps replaced), owners taken over,
    and a definition version for each new and changed one, as :func:`upsert_schedule` does."""
    owner = {"source": ScheduleSource.FILE, "source_name": source}
    steps: list[dict[str, Any]] = []
    versions: list[dict[str, Any]] = []
    if writes.added:
        new_rows = []
        for definition in writes.added:
            values = definition_values(definition)
            values |= changed_definition_values(definition, values, now=now, paused_by=None)
            counters = {"run_count": 0, "error_count": 0, "buffered": False}
            new_rows.append({"name": definition.name, "created_at": now, "version": 1, **counters, **owner, **values})
        # One executemany, then the ids by name: an INSERT ... RETURNING of many rows is sent as
        # one statement of thousands of placeholders, which psycopg took 0.4 s a batch to parse.
        session.execute(insert(SCHEDULES), new_rows)
        ids: dict[str, int] = {}
        for names in chunks([definition.name for definition in writes.added]):
            query = select(SCHEDULES.c.name, SCHEDULES.c.id).where(SCHEDULES.c.name.in_(names))
            ids.update((name, schedule_id) for name, schedule_id in session.execute(query))
        for definition in writes.added:
            steps += [{"schedule_id": ids[definition.name], **step} for step in step_values(definition)]
            schedule_id = ids[definition.name]
            versions.append(version_values(schedule_id, definition.name, 1, definition.to_json(), origin, now=now))
    if writes.changed:
        # Steps are replaced wholesale: the old rows go first so their unique names are free.
        for chunk in chunks([stored.id for stored, _ in writes.changed]):
            session.execute(delete(STEPS).where(STEPS.c.schedule_id.in_(chunk)))
        changes = []
        for stored, definition in writes.changed:
            values = definition_values(definition)
            values |= changed_definition_values(definition, values, now=now, paused_by=None)
            changes.append({"b_id": stored.id, "version": stored.version + 1, **owner, **values})
            steps += [{"schedule_id": stored.id, **step} for step in step_values(definition)]
            versions.append(
                version_values(stored.id, stored.name, stored.version + 1, definition.to_json(), origin, now=now)
            )
        session.execute(update(SCHEDULES).where(SCHEDULES.c.id == bindparam("b_id")), changes)
    if writes.taken:
        taken = [{"b_id": stored.id, **owner} for stored in writes.taken]
        session.execute(update(SCHEDULES).where(SCHEDULES.c.id == bindparam("b_id")), taken)
    if steps:
        session.execute(insert(STEPS), steps)
    if versions:
        session.execute(insert(SCHEDULE_VERSIONS), versions)
