"""RedBeat entries of schedules: written from the database and reconciled with it.

Slots whose fire message was lost are fired again by :mod:`celeryapp.recovery.lost_slots`.

Every active schedule has exactly one dynamic RedBeat entry (``<prefix>schedule:<name>``) that
sends ``chordbeat.fire_schedule``. Entries are written whenever a schedule changes and repaired
by :func:`reconcile`, so the database stays the source of truth.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from redbeat.schedulers import ensure_conf
from redbeat.schedulers import get_redis as redbeat_client
from sqlalchemy import select

from celeryapp.domain.cadence import cadence_of
from celeryapp.runtime import Runtime
from celeryapp.scheduling.stored_entry import (
    CadenceSchedule,
    CorruptEntry,
    ScheduleEntry,
    check_reply,
    meta_json,
    wrong_type,
)
from models import Schedule, ScheduleStatus, transaction, utcnow

logger = logging.getLogger(__name__)
T = TypeVar("T")

FIRE_TASK = "chordbeat.fire_schedule"
#: A rebuilt entry whose retry is overdue gets a last fire time this much before the retry, so
#: beat fires the retry at once instead of moving past it.
RETRY_LEAD = timedelta(milliseconds=1)
ENTRY_PREFIX = "schedule:"


def entry_name(schedule_name: str) -> str:
    return ENTRY_PREFIX + schedule_name


@dataclass(frozen=True)
class EntryFields:
    """What a schedule's entry is made of: a few columns, never its steps."""

    name: str
    status: ScheduleStatus
    cron: str | None
    every_s: float | None
    timezone: str
    updated_at: datetime
    retry_at: datetime | None
    #: The stored ``dst`` object (None: the default DST rule).
    dst: dict[str, Any] | None = None


#: The columns a beat entry is made of, in EntryFields' order (the fire path reads them too).
ENTRY_COLUMNS = (
    Schedule.name,
    Schedule.status,
    Schedule.cron,
    Schedule.every_s,
    Schedule.timezone,
    Schedule.updated_at,
    Schedule.retry_at,
    Schedule.dst,
)

#: Schedules one query and one Redis pipeline handle at a time: far below SQLite's 32,766 bound
#: parameters, and replies of a few hundred KiB.
CHUNK = 500
#: The periodic reconcile looks again at schedules changed this long before its previous pass
#: started: clocks of the hosts that write schedules differ, and a transaction stamped before that
#: pass may have committed after it read.
CHANGE_MARGIN = timedelta(minutes=5)
#: Key, under RedBeat's prefix (lost with the entries), of when the last reconcile pass started.
#: Without it the next pass is a full one.
WATERMARK_KEY = "reconciled-at"


def chunks(items: Sequence[T], size: int = CHUNK) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def desired_entry(app: Runtime, schedule: Schedule | EntryFields, now: datetime) -> ScheduleEntry | None:
    """The entry the schedule should have; its last fire time is used only for a new entry."""
    if schedule.status is not ScheduleStatus.ACTIVE:
        return None
    # A new entry starts at ``now`` (no make-up run), except that an overdue retry (entries lost
    # with Redis while it was due) must still fire.
    last_run_at = min(now, schedule.retry_at - RETRY_LEAD) if schedule.retry_at is not None else now
    return ScheduleEntry(
        name=entry_name(schedule.name),
        task=FIRE_TASK,
        schedule=CadenceSchedule(cadence_of(schedule), schedule.retry_at),
        kwargs={"name": schedule.name},
        # No options: beat sends a schedule's fires itself (fire_messages: to the control queue,
        # keeping no result), never through Celery's apply_entry that would read them.
        last_run_at=last_run_at,
        app=app,
    )


@dataclass
class EntryChanges:
    written: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.written or self.removed)


def _cadence_part(definition: str) -> Any:
    schedule = json.loads(definition).get("schedule", {})
    if not isinstance(schedule, dict):
        return schedule
    # A field stored as null and one left out are the same (a previous version wrote the nulls).
    return {k: v for k, v in schedule.items() if k != "retry_at" and v is not None}


def _kept_last_run(stored: str | None, meta: str | None, wanted: str) -> datetime | None:
    """When beat last fired the stored entry, if it has the cadence of ``wanted`` (a changed retry
    time only adds a due time); ``None`` if there is none to keep."""
    if stored is None:
        return None
    try:
        ScheduleEntry.decode_definition(stored)  # safe to compare as plain JSON from here on
        kept: datetime | None = ScheduleEntry.decode_meta(meta)["last_run_at"]
    except CorruptEntry:
        return None  # unreadable (beat dropped it from its index): written anew, as a new entry is
    return kept if kept is not None and _cadence_part(stored) == _cadence_part(wanted) else None


def _entry_fields(app: Runtime, names: Sequence[str]) -> dict[str, EntryFields]:
    with transaction(app.settings.database_url, read_only=True) as session:
        rows = session.execute(select(*ENTRY_COLUMNS).where(Schedule.name.in_(names))).all()
    return {row.name: EntryFields(*row) for row in rows}


def sync_schedules(app: Runtime, names: Iterable[str]) -> EntryChanges:
    """Bring the RedBeat entries of these schedules in line with the database.

    Per chunk of schedules: one query (entry columns only), one pipeline reading what is stored,
    one pipeline writing what differs.
    """
    ensure_conf(app)
    changes = EntryChanges()
    now = utcnow()
    for chunk in chunks(sorted(set(names))):
        _sync_chunk(app, chunk, now, changes)
    return changes


def _sync_chunk(app: Runtime, names: Sequence[str], now: datetime, changes: EntryChanges) -> None:
    found = _entry_fields(app, names)
    desired: dict[str, ScheduleEntry | None] = {}
    for name in names:
        try:
            desired[name] = desired_entry(app, found[name], now) if name in found else None
        except Exception:
            # One unreadable schedule (a corrupt row) must not stop every other entry's repair.
            logger.exception("beat entry of schedule %r cannot be built; left as it is", name)
    client = redbeat_client(app)
    index_key = app.redbeat_conf.schedule_key
    entry_keys = {name: ScheduleEntry.generate_key(app, entry_name(name)) for name in desired}
    with client.pipeline(transaction=False) as pipe:
        for key in entry_keys.values():
            pipe.hmget(key, "definition", "meta")
            pipe.zscore(index_key, key)
        replies = pipe.execute(raise_on_error=False)
    with client.pipeline(transaction=False) as pipe:
        for position, (name, entry) in enumerate(desired.items()):
            fields, score = replies[2 * position], check_reply(replies[2 * position + 1])
            if wrong_type(fields):
                pipe.delete(entry_keys[name])  # not a hash: written anew below, or gone
                fields = (None, None)
            stored, meta = fields
            try:
                _queue_write(pipe, app, entry_keys[name], entry, stored, meta, score)
            except Exception:
                logger.exception("beat entry of schedule %r cannot be written; left as it is", name)
                continue
            if entry is not None and (stored != entry.definition_json() or score is None):
                changes.written.append(name)
            elif entry is None and (stored is not None or score is not None):
                changes.removed.append(name)
        if len(pipe):
            pipe.execute()


def _queue_write(
    pipe: Any,
    app: Runtime,
    key: str,
    entry: ScheduleEntry | None,
    stored: str | None,
    meta: str | None,
    score: float | None,
) -> None:
    """Queue on ``pipe`` what makes the stored entry the desired one (nothing if it already is)."""
    index_key = app.redbeat_conf.schedule_key
    if entry is None:
        if stored is not None or score is not None:
            pipe.zrem(index_key, key)
            pipe.delete(key)
        return
    wanted = entry.definition_json()
    if stored == wanted and score is not None:
        return
    kept = _kept_last_run(stored, meta, wanted)
    same_cadence = kept is not None
    if kept is not None:
        # Same cadence: keep when beat last fired it (a changed retry time only adds a due time).
        entry.last_run_at = kept
    new_meta = meta_json(entry.last_run_at)
    new_score = entry.score  # computed before anything is queued: a bad entry queues nothing
    pipe.hset(key, "definition", wanted)
    if same_cadence:
        pipe.hsetnx(key, "meta", new_meta)  # beat may have fired it meanwhile: its time wins
    else:
        pipe.hset(key, "meta", new_meta)
    pipe.zadd(index_key, {key: new_score})


def _watermark(value: str | None) -> datetime | None:
    try:
        return datetime.fromtimestamp(float(value), UTC) if value is not None else None
    except (TypeError, ValueError, OverflowError):
        return None


def reconcile_fully_next(app: Runtime) -> None:
    """Make the next periodic reconcile a full pass: it writes again every entry missing from the
    index (one beat dropped, unreadable), not only those of schedules changed since the last."""
    redbeat_client(app).delete(app.redbeat_conf.key_prefix + WATERMARK_KEY)


def reconcile(app: Runtime, *, full: bool = False) -> EntryChanges:
    """Repair drift both ways: missing or stale entries written, orphaned ones removed.

    Periodically it looks only at schedules changed (``changed_at``) since its previous pass; a
    full pass (beat's start, a lost lock, Redis restarted, no previous pass recorded) compares every
    active schedule and every entry in RedBeat's index (never a scan of the Redis database).
    Schedules deleted without their entry going too are cleaned up by their next fire.
    """
    ensure_conf(app)
    client = redbeat_client(app)
    mark = app.redbeat_conf.key_prefix + WATERMARK_KEY
    started = utcnow()
    since = None if full else _watermark(client.get(mark))
    with transaction(app.settings.database_url, read_only=True) as session:
        if since is None:
            names = set(session.scalars(select(Schedule.name).where(Schedule.status == ScheduleStatus.ACTIVE)))
        else:
            names = set(session.scalars(select(Schedule.name).where(Schedule.changed_at >= since - CHANGE_MARGIN)))
    if since is None:
        prefix = app.redbeat_conf.key_prefix + ENTRY_PREFIX
        names |= {
            key[len(prefix) :]
            for key, _score in client.zscan_iter(app.redbeat_conf.schedule_key, match=prefix + "*", count=1000)
        }
    changes = sync_schedules(app, names)
    client.set(mark, repr(started.timestamp()))
    if not changes.empty:
        logger.warning(
            "beat entries repaired: written %s; removed %s",
            short_name_list(changes.written),
            short_name_list(changes.removed),
        )
    return changes


#: Names a log line lists at most (a first full pass may write tens of thousands of entries).
LOGGED_NAMES = 20


def short_name_list(names: Sequence[str]) -> str:
    """``a, b, c``, or the first :data:`LOGGED_NAMES` and ``and N more``, for a log line."""
    if len(names) <= LOGGED_NAMES:
        return ", ".join(names) or "-"
    return f"{', '.join(names[:LOGGED_NAMES])} and {len(names) - LOGGED_NAMES} more"
