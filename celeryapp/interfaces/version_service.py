"""The definition versions' service operations: a schedule's versions, one version's definition,
the difference of two, and a rollback to one (docs/versions.md). JSON in, JSON out; every
argument is checked before the transaction opens, as in service.py."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from celeryapp.domain.definition_versions import diff_definitions
from celeryapp.domain.effects import Effects
from celeryapp.domain.limits import MAX_LIST_LIMIT
from celeryapp.domain.redaction import hide_env_values
from celeryapp.domain.times import iso
from celeryapp.domain.validation import parse_definition
from celeryapp.errors import NotFound
from celeryapp.interfaces.arguments import actor_arg, limit_arg, name_arg, reason_arg, version_arg
from celeryapp.interfaces.objects import one_schedule_json
from celeryapp.interfaces.service import step_rules
from celeryapp.scheduling.calendar_files import calendar_reader
from celeryapp.scheduling.store import find_schedule, upsert_schedule
from celeryapp.states import AuditAction, AuditSource
from celeryapp.worker.dispatch import apply_effects
from models import transaction, utcnow
from models.session import retried_transaction
from models.version_tables import ScheduleVersion
from models.versions import VersionOrigin, version_of, versions_of

if TYPE_CHECKING:
    from celeryapp.application import ChordbeatCelery


def list_versions(app: ChordbeatCelery, name: str, limit: int = 50, before: int | None = None) -> list[dict[str, Any]]:
    """The schedule's versions, newest first; ``before``: only older ones (the cursor: a page's last)."""
    name, limit = name_arg(name), limit_arg(limit, MAX_LIST_LIMIT)
    older_than = None if before is None else version_arg(before, "before")
    with transaction(app.settings.database_url, read_only=True) as session:
        schedule = find_schedule(session, name)
        return [_version_json(row) for row in versions_of(session, schedule.id, limit=limit, before=older_than)]


def get_version(app: ChordbeatCelery, name: str, version: int) -> dict[str, Any]:
    """The definition of version ``version`` (``env`` values hidden, as the schedule object hides them)."""
    name, version = name_arg(name), version_arg(version)
    with transaction(app.settings.database_url, read_only=True) as session:
        definition = _definition(session, name, version)
    return {**definition, "steps": hide_env_values(definition.get("steps", []))}


def diff_versions(app: ChordbeatCelery, name: str, a: int, b: int) -> list[dict[str, Any]]:
    """What changed from version ``a`` to ``b``: ``[{"path", "op", "old", "new"}]``."""
    name, a, b = name_arg(name), version_arg(a, "a"), version_arg(b, "b")
    with transaction(app.settings.database_url, read_only=True) as session:
        old, new = _definition(session, name, a), _definition(session, name, b)
    return [difference.env_hidden().to_json() for difference in diff_definitions(old, new)]


def rollback_schedule(
    app: ChordbeatCelery,
    name: str,
    version: int,
    actor: str | None = None,
    reason: str | None = None,
    *,
    source: AuditSource = AuditSource.SERVICE,
) -> dict[str, Any]:
    """The schedule's definition made that of version ``version`` again, as a new version (none
    when it is the current definition already), checked as an apply is; the schedule object."""
    name, version, who, why = name_arg(name), version_arg(version), actor_arg(actor, source), reason_arg(reason)
    rules, calendars = step_rules(app), calendar_reader(app.settings.calendars_dir)

    def roll_back(session: Session) -> dict[str, Any]:
        now = utcnow()
        schedule = find_schedule(session, name)
        was = schedule.version
        # Checked again as an apply is: a task or channel gone since is refused, naming the field.
        definition = parse_definition(
            _definition(session, name, version), rules=rules, channels=app.alert_channels, calendars=calendars
        )
        schedule, change = upsert_schedule(
            session,
            definition,
            source=schedule.source,
            source_name=schedule.source_name,
            now=now,
            origin=VersionOrigin.of(who, why),
            paused_by=who.name,
        )
        detail = {"to": version, "from": was, "version": schedule.version, "change": change.value}
        who.record(session, AuditAction.ROLLBACK, name, reason=why, detail=detail, at=now)
        return one_schedule_json(session, schedule, now)

    result = retried_transaction(app.settings.database_url, f"rolling back schedule {name!r}", roll_back)
    apply_effects(app, Effects(resync=[name]))
    return result


def _definition(session: Session, name: str, version: int) -> dict[str, Any]:
    row = version_of(session, find_schedule(session, name).id, version)
    if row is None:
        raise NotFound(f"schedule {name!r} has no version {version}")
    stored: dict[str, Any] = json.loads(row.definition)
    return stored


def _version_json(row: ScheduleVersion) -> dict[str, Any]:
    return {
        "version": row.version,
        "at": iso(row.at),
        "actor": row.actor,
        "source": row.source,
        "reason": row.reason,
        "file": row.file,
        "commit": row.commit,
        "hash": row.hash,
    }
