"""The declarative schedule file: its schedules override stored ones, with a logged diff.

A file is one *source* (its top-level ``source:``, by default its name without the extension):
applying it prunes only the schedules that source declared before, never another file's. Its
``limits:`` (shared limits, docs/limits.md) are applied first, in the same transaction, so its
schedules may use them; a limit it no longer names goes with the same rule, unless still held.

The file is YAML written by operators, read strictly: at most ``CHORDBEAT_SCHEDULE_FILE_MAX_BYTES``
(4 MiB by default), no anchors, aliases, merge keys or duplicate keys; errors name the file and
the line. It is read once per apply, and written in a few statements per thousand schedules
(:mod:`celeryapp.scheduling.file_rows`).
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from celeryapp.domain.alert_fields import KnownChannels
from celeryapp.domain.calendar_fields import CalendarReader
from celeryapp.domain.definition import NAME_PATTERN, ScheduleDefinition
from celeryapp.domain.definition_versions import diff_definitions
from celeryapp.domain.limits import short_repr, type_name
from celeryapp.domain.problems import Problems
from celeryapp.domain.shared_limits import LimitDefinition, parse_limit
from celeryapp.domain.step_policy import StepRules
from celeryapp.domain.strict_yaml import YamlMistake, read_yaml
from celeryapp.domain.validation import parse_definitions
from celeryapp.errors import DefinitionError
from celeryapp.monitoring import metric_counts, worker_registry
from celeryapp.runtime import Runtime
from celeryapp.scheduling.beat_entries import chunks, sync_schedules
from celeryapp.scheduling.calendar_files import calendar_reader
from celeryapp.scheduling.file_commit import file_commit
from celeryapp.scheduling.file_rows import (
    FileWrites,
    StoredSchedule,
    read_stored,
    source_schedules,
    write_definitions,
)
from celeryapp.scheduling.store import check_file_limits_known
from celeryapp.states import AuditAction
from celeryapp.variables import DEFAULT_SCHEDULE_FILE_MAX_BYTES
from models import Schedule, ScheduleSource, utcnow
from models.audit import BEAT, REASON_CHARS, Actor
from models.session import retried_transaction
from models.versions import VersionOrigin

logger = logging.getLogger(__name__)


@dataclass
class FileDiff:
    source: str = ""
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    #: This source's schedules the file no longer names, kept because their removal was not confirmed.
    kept: list[str] = field(default_factory=list)
    #: Schedules the file names that belonged to the API or another file: name -> previous owner.
    taken_over: dict[str, str] = field(default_factory=dict)
    #: Changed schedules: name -> the definition fields that differ.
    fields: dict[str, list[str]] = field(default_factory=dict)
    #: The file's limits: ``added``, ``changed``, ``removed``, ``unchanged``, ``kept`` and
    #: ``taken_over`` (from the service tasks or another file), each a list of names.
    limits: dict[str, list[str]] = field(default_factory=dict)
    #: Changed schedules: name -> what differs, field by field (``diff_versions``' objects, ``env``
    #: values hidden): what the change's new version will differ in from the current one.
    differences: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: Why the steps were checked against this process's tasks instead of the workers' (none had
    #: published theirs); ``None`` when the workers' were used.
    checked_here: str | None = None

    @property
    def empty(self) -> bool:
        return not (self.added or self.changed or self.removed) and not any(
            self.limits.get(kind) for kind in ("added", "changed", "removed")
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "added": self.added,
            "changed": self.changed,
            "removed": self.removed,
            "unchanged": self.unchanged,
            "kept": self.kept,
            "taken_over": self.taken_over,
            "fields": self.fields,
            "limits": self.limits,
            "differences": self.differences,
        }

    def summary(self) -> str:
        parts = [
            f"{label} {', '.join(names)}"
            for label, names in (
                ("added", self.added),
                ("changed", self.changed),
                ("removed", self.removed),
                ("kept (not removed)", self.kept),
            )
            if names
        ] + [
            f"limits {label} {', '.join(self.limits[kind])}"
            for kind, label in (("added", "added"), ("changed", "changed"), ("removed", "removed"), ("kept", "kept"))
            if self.limits.get(kind)
        ]
        return "; ".join(parts) if parts else "no changes"


@dataclass(frozen=True)
class ScheduleFile:
    """A validated schedule file: its source name, its schedules and its limits."""

    source: str
    definitions: list[ScheduleDefinition]
    limits: list[LimitDefinition] = field(default_factory=list)
    #: Why the steps were checked against this process's tasks (see ``FileDiff.checked_here``).
    checked_here: str | None = None


def source_name(path: str | Path, declared: Any) -> str:
    """The file's ``source:``, or its name without the extension (``hr.yaml`` is ``hr``)."""
    if declared is None:
        stem = Path(path).stem
        if NAME_PATTERN.fullmatch(stem):
            return stem
        raise DefinitionError(
            "source", f"the file name {short_repr(stem)} is not a usable source name; add 'source: <name>'"
        )
    if not isinstance(declared, str) or not NAME_PATTERN.fullmatch(declared):
        raise DefinitionError(
            "source", f"must be a name of letters, digits, '.', '_' and '-' (at most 200), got {short_repr(declared)}"
        )
    return declared


def load_file(
    path: str | Path,
    *,
    rules: StepRules | None,
    channels: KnownChannels | None = None,
    calendars: CalendarReader | None = None,
) -> list[ScheduleDefinition]:
    """Read and validate a whole schedule file's schedules (see :func:`read_file`)."""
    return read_file(path, rules=rules, channels=channels, calendars=calendars).definitions


def read_file(
    path: str | Path,
    *,
    rules: StepRules | None,
    channels: KnownChannels | None = None,
    calendars: CalendarReader | None = None,
    max_bytes: int = DEFAULT_SCHEDULE_FILE_MAX_BYTES,
) -> ScheduleFile:
    """Read and validate a whole schedule file; raise :class:`DefinitionError` naming every invalid schedule.

    ``rules`` are the workers' and ``channels`` the deployment's alert channels, ``calendars`` reads
    its named calendars (see :func:`celeryapp.domain.validation.parse_definition`). A file over
    ``max_bytes`` is refused before any of it is parsed (at most ``max_bytes`` + 1 are read).
    """
    where = str(path)
    try:
        with open(path, "rb") as stream:
            data = stream.read(max_bytes + 1)
    except OSError as exc:
        raise DefinitionError(where, f"cannot be read ({exc.strerror})") from None
    if len(data) > max_bytes:
        raise DefinitionError(where, f"is larger than {max_bytes} bytes (CHORDBEAT_SCHEDULE_FILE_MAX_BYTES)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DefinitionError(where, f"is not UTF-8 text (byte {exc.start})") from None
    del data
    with collector_paused():
        return _parse_file(path, text, rules=rules, channels=channels, calendars=calendars)


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off meanwhile: reading and writing a large file makes millions
    of objects that live on until it is applied, and the collections they set off took two thirds
    of a 100,000-schedule file's parse, for nothing (docs/scaling.md, "The apply's cost"). What
    the apply leaves is collected after, as ever."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def _parse_file(
    path: str | Path,
    text: str,
    *,
    rules: StepRules | None,
    channels: KnownChannels | None,
    calendars: CalendarReader | None,
) -> ScheduleFile:
    where = str(path)
    try:
        document: Any = read_yaml(text)
    except YamlMistake as exc:
        raise DefinitionError(where, str(exc)) from None
    if document is None:
        document = {"schedules": []}
    if not isinstance(document, dict) or set(document) - {"schedules", "source", "limits"}:
        raise DefinitionError(where, "must be a mapping with the keys 'schedules' and (optional) 'source' and 'limits'")
    source = source_name(path, document.get("source"))
    items = document.get("schedules") or []
    if not isinstance(items, list):
        raise DefinitionError("schedules", "must be a list of schedule definitions")
    # Both lists checked before either is refused: every mistake of the file at once.
    problems = Problems()
    limit_list = problems.check(parse_limit_list, document.get("limits"))
    definitions = problems.check(parse_definitions, items, rules=rules, channels=channels, calendars=calendars)
    problems.raise_any()
    assert limit_list is not None and definitions is not None
    return ScheduleFile(source, definitions, limit_list)


def parse_limit_list(items: Any) -> list[LimitDefinition]:
    """A file's ``limits:``: every mistake of every limit at once, each named ``limits[0] (name).field``.
    Two limits of one name, or of names that differ only in case (``Warehouse``, ``warehouse``:
    one would be taken for the other on a page), are refused."""
    if items is None:
        return []
    if not isinstance(items, list):
        raise DefinitionError("limits", f"must be a list of limit definitions, got {type_name(items)}")
    problems = Problems()
    parsed: list[LimitDefinition] = []
    seen: dict[str, tuple[int, str]] = {}
    for index, raw in enumerate(items):
        label = raw.get("name") if isinstance(raw, dict) else None
        shown = isinstance(label, str) and NAME_PATTERN.fullmatch(label)
        problems.prefix = f"limits[{index}]" + (f" ({label})" if shown else "") + "."
        definition = problems.check(parse_limit, raw)
        if definition is None:
            continue
        folded = definition.name.casefold()
        if folded in seen:
            other, name = seen[folded]
            what = "appears twice" if name == definition.name else f"differs from {name!r} only in case"
            problems.add(DefinitionError("name", f"limit {definition.name!r} {what} (limits[{other}])"))
        seen.setdefault(folded, (index, definition.name))
        parsed.append(definition)
    problems.raise_any()
    return parsed


def apply_definitions(
    session: Session,
    definitions: list[ScheduleDefinition],
    *,
    source: str,
    origin: VersionOrigin,
    dry_run: bool = False,
    remove: bool | Collection[str] = True,
    file_limits: Sequence[LimitDefinition] = (),
    removed_limits: Collection[str] = (),
) -> FileDiff:
    """Make the stored schedules of the file source ``source`` match ``definitions``, whose uses
    may name the ``file_limits`` the same file defines, and not the ``removed_limits`` it removes.

    Schedules created through the API, or declared by another file, are left alone unless this
    file names them, in which case the file wins and they become this source's. Removed schedules
    keep their execution history. ``remove`` says which of this source's schedules that the file
    no longer names may be deleted: all (``True``), none, or the given names (those confirmed);
    the others are kept and listed in ``diff.kept``.
    """
    now = utcnow()
    diff = FileDiff(source=source)
    check_file_limits_known(session, definitions, file_limits, removed_limits)  # a dry run too
    wanted = [d.name for d in definitions]
    writes = compare_definitions(diff, definitions, read_stored(session, wanted, lock=not dry_run))
    if not dry_run:
        write_definitions(session, writes, source=source, origin=origin, now=now)
    kept = set(wanted)
    gone: list[int] = []
    for name, schedule_id in sorted(source_schedules(session, source).items()):
        if name in kept:
            continue
        if remove is True or (remove is not False and name in remove):
            diff.removed.append(name)
            gone.append(schedule_id)
        else:
            diff.kept.append(name)
    for chunk in chunks(gone) if not dry_run else ():
        for schedule in session.scalars(select(Schedule).where(Schedule.id.in_(chunk))):
            session.delete(schedule)
            metric_counts.retire_schedule(session, schedule.name)
    session.flush()
    if not dry_run:
        logger.info("schedule file (source %s) applied: %s", source, diff.summary())
    return diff


def compare_definitions(
    diff: FileDiff, definitions: list[ScheduleDefinition], stored: dict[str, StoredSchedule]
) -> FileWrites:
    """What the file's ``definitions`` change against the ``stored`` schedules they name, said in
    ``diff`` (added, changed field by field, unchanged, taken over) and returned as the writes."""
    source = diff.source
    writes = FileWrites()
    for definition in definitions:
        current = stored.get(definition.name)
        if current is None:
            diff.added.append(definition.name)
            writes.added.append(definition)
            continue
        owner = current.source_name if current.source is ScheduleSource.FILE else None
        if owner != source:
            diff.taken_over[definition.name] = f"source {owner}" if owner else "the API"
        if current.definition == definition:
            diff.unchanged.append(definition.name)
            if owner != source:
                writes.taken.append(current)
            continue
        diff.changed.append(definition.name)
        writes.changed.append((current, definition))
        before, after = current.definition.to_json(), definition.to_json()
        fields = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        if fields:
            diff.fields[definition.name] = fields
            found = diff_definitions(before, after)
            diff.differences[definition.name] = [difference.env_hidden().to_json() for difference in found]
    return writes


def record_file_applied(session: Session, actor: Actor, path: str | Path, diff: FileDiff, reason: str | None) -> None:
    """The audit row of an applied file (beat at its start, a person with ``chordbeat apply``): one
    row for the whole file, in the apply's own transaction, so the file and its record commit
    together. The reason is the caller's, else the diff's summary (its schedules' names, cut to a
    reason's length); the counts in the detail are whole."""
    detail = {
        "file": str(path)[:REASON_CHARS],
        "source": diff.source,
        **{kind: len(getattr(diff, kind)) for kind in ("added", "changed", "removed", "unchanged", "kept")},
    }
    if any(diff.limits.values()):
        detail["limits"] = {kind: len(names) for kind, names in diff.limits.items()}
    if reason is None:
        summary = diff.summary()
        reason = summary if len(summary) <= REASON_CHARS else summary[: REASON_CHARS - 1] + "…"
    actor.record(session, AuditAction.FILE_APPLIED, None, reason=reason, detail=detail)


def record_limit_changes(
    session: Session, actor: Actor, path: str | Path, schedule_file: ScheduleFile, diff: FileDiff, reason: str | None
) -> None:
    """A limit changed by a file is audited as one changed through the service is (its own
    ``limit_applied`` or ``limit_deleted`` row, found by the limit's name), with the file named."""
    place = {"file": str(path)[:REASON_CHARS], "source": diff.source}
    definitions = {limit.name: limit for limit in schedule_file.limits}
    for kind in ("added", "changed"):
        for name in diff.limits.get(kind, []):
            detail = {"limit": name, "created": kind == "added", "definition": definitions[name].to_json(), **place}
            actor.record(session, AuditAction.LIMIT_APPLIED, None, reason=reason, detail=detail)
    for name in diff.limits.get("removed", []):
        detail = {"limit": name, "force": False, "held_slots": 0, **place}
        actor.record(session, AuditAction.LIMIT_DELETED, None, reason=reason, detail=detail)


def read_app_file(app: Runtime, path: str | Path) -> ScheduleFile:
    """Read and validate a schedule file as the deployment ``app`` checks one: against its workers'
    tasks, its alert channels and calendars, within its file size limit."""
    checked = worker_registry.checked_rules(app.settings, app.tasks.__contains__)
    # The channels file is read by the app (the alerting layer, above this one).
    calendars = calendar_reader(app.settings.calendars_dir)
    max_bytes = app.settings.schedule_file_max_bytes
    read = read_file(path, rules=checked.rules, channels=app.alert_channels, calendars=calendars, max_bytes=max_bytes)
    return replace(read, checked_here=checked.fallback)


def apply_file(
    app: Runtime,
    path: str | Path,
    *,
    dry_run: bool = False,
    remove: bool | Collection[str] = True,
    actor: Actor | None = None,
    reason: str | None = None,
    remove_limits: bool | Collection[str] = True,
    commit: str | None = None,
    schedule_file: ScheduleFile | None = None,
) -> FileDiff:
    """Validate and apply a schedule file in one transaction: all of it or nothing, with the
    ``file_applied`` audit row of ``actor`` when one is given (not for a dry run), and a
    ``limit_applied`` or ``limit_deleted`` row for each limit it changes. The versions it makes
    name the file and ``commit`` (by default the file's repository's, when it is in one).

    Its limits are applied first (its schedules may use them). Only schedules and limits of the
    file's own source are pruned (see :func:`apply_definitions`); ``remove_limits`` says which
    limits, as ``remove`` says which schedules. A held limit is never pruned: the file is refused.
    ``schedule_file``: the file as :func:`read_app_file` read it already (a dry run's, then the
    apply's: what was shown is what is applied); by default it is read here.
    """
    if schedule_file is None:
        schedule_file = read_app_file(app, path)

    origin = VersionOrigin.of(
        actor or BEAT, reason, file=str(path), commit=None if dry_run else commit or file_commit(path)
    )

    def apply(session: Session) -> FileDiff:
        limit_changes = app.apply_file_limits(
            session,
            [limit.to_json() for limit in schedule_file.limits],
            source=schedule_file.source,
            dry_run=dry_run,
            remove=remove_limits,
        )
        diff = apply_definitions(
            session,
            schedule_file.definitions,
            source=schedule_file.source,
            origin=origin,
            dry_run=dry_run,
            remove=remove,
            file_limits=schedule_file.limits,
            removed_limits=limit_changes.get("removed", ()),
        )
        diff.limits = limit_changes
        if actor is not None and not dry_run:
            record_limit_changes(session, actor, path, schedule_file, diff, reason)
            record_file_applied(session, actor, path, diff, reason)
        return diff

    what = f"applying {path}"
    with collector_paused():
        try:
            diff = retried_transaction(app.settings.database_url, what, apply)
        except IntegrityError:
            # Another beat applied the same file at the same moment; the second pass sees its rows.
            diff = retried_transaction(app.settings.database_url, what, apply)
        diff.checked_here = schedule_file.checked_here
        if not dry_run:
            try:
                sync_schedules(app, diff.added + diff.changed + diff.removed)
            except redis.RedisError as exc:
                logger.warning("beat entries not updated (%s); beat repairs them when it starts", exc)
    return diff
