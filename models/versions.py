"""Definition versions' writer and readers: a version is written in the transaction of the
definition change that makes it, so a definition and its version commit or roll back together."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from celeryapp.domain.definition import ScheduleDefinition
from celeryapp.domain.definition_versions import canonical_json, definition_hash
from celeryapp.domain.validation import parse_definition
from celeryapp.states import AuditSource
from models.audit import ACTOR_CHARS, REASON_CHARS, Actor
from models.tables import Schedule
from models.version_tables import COMMIT_LENGTH, FILE_LENGTH, SCHEDULE_VERSIONS, ScheduleVersion


@dataclass(frozen=True)
class VersionOrigin:
    """Who made a definition change, from where and why; for a schedule file, its name and the
    commit it was read at, when known."""

    actor: str
    source: AuditSource
    reason: str | None = None
    file: str | None = None
    commit: str | None = None

    @classmethod
    def of(cls, actor: Actor, reason: str | None = None, **where: str | None) -> VersionOrigin:
        return cls(actor.name, actor.source, reason, **where)


class PinnedVersion(NamedTuple):
    """A definition version that runs start with instead of the schedule's current definition."""

    version: int
    definition: ScheduleDefinition


def record_version(
    session: Session, schedule: Schedule, definition: dict[str, Any], origin: VersionOrigin, *, now: datetime
) -> None:
    """Store ``definition`` (a definition's JSON object) as version ``schedule.version``."""
    values = version_values(schedule.id, schedule.name, schedule.version, definition, origin, now=now)
    session.execute(insert(SCHEDULE_VERSIONS).values(**values))


def version_values(
    schedule_id: int, name: str, version: int, definition: dict[str, Any], origin: VersionOrigin, *, now: datetime
) -> dict[str, Any]:
    """The ``schedule_versions`` row of ``definition`` as version ``version`` of a schedule: one
    change's, or one of the many a file's apply writes in one statement."""
    text = canonical_json(definition)
    return {
        "schedule_id": schedule_id,
        "schedule_name": name,
        "version": version,
        "definition": text,
        "hash": definition_hash(text),
        "at": now,
        "actor": origin.actor[:ACTOR_CHARS],
        "source": origin.source.value,
        "reason": None if origin.reason is None else origin.reason[:REASON_CHARS],
        "file": None if origin.file is None else origin.file[:FILE_LENGTH],
        "commit": None if origin.commit is None else origin.commit[:COMMIT_LENGTH],
    }


def versions_of(session: Session, schedule_id: int, *, limit: int, before: int | None = None) -> list[ScheduleVersion]:
    """A schedule's versions, newest first; ``before``: only those older than it (the cursor)."""
    query = select(ScheduleVersion).where(ScheduleVersion.schedule_id == schedule_id)
    if before is not None:
        query = query.where(ScheduleVersion.version < before)
    return list(session.scalars(query.order_by(ScheduleVersion.version.desc()).limit(limit)))


def definition_at(session: Session, schedule_id: int, version: int) -> PinnedVersion | None:
    """Version ``version``'s definition, to run it again (a backfill naming it); None when the
    schedule has no such version. Checked as any stored definition was (not against the workers'
    rules: the runs' steps are checked when they run)."""
    row = version_of(session, schedule_id, version)
    if row is None:
        return None
    return PinnedVersion(version, parse_definition(json.loads(row.definition)))


def version_of(session: Session, schedule_id: int, version: int) -> ScheduleVersion | None:
    return session.scalar(
        select(ScheduleVersion).where(ScheduleVersion.schedule_id == schedule_id, ScheduleVersion.version == version)
    )
