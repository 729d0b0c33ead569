"""RedBeat entries of schedules: a schedule type RedBeat can store, and syncing entries with the DB.

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

import redis
from celery import Celery
from celery.beat import ScheduleEntry as BaseScheduleEntry
from celery.schedules import BaseSchedule, schedstate
from redbeat.decoder import RedBeatJSONDecoder, RedBeatJSONEncoder
from redbeat.schedulers import RedBeatSchedulerEntry, ensure_conf, get_redis
from sqlalchemy import and_, or_, select

from celeryapp.execution.runs import run_key
from celeryapp.messaging import keys
from celeryapp.scheduling.cadence import Cadence, Due, next_due
from models import ExecutionStatus, Schedule, ScheduleExecution, ScheduleStatus, Trigger, transaction, utcnow

logger = logging.getLogger(__name__)
T = TypeVar("T")

FIRE_TASK = "chordbeat.fire_schedule"
#: A regular slot's fire message expires this long after the next slot is due. By then it is
#: superseded anyway (:func:`celeryapp.execution.decisions.decide_fire`); the grace lets a late one still
#: record its slot as superseded. (Beat and workers reckon it by the same reference clock.)
FIRE_EXPIRY_GRACE = timedelta(minutes=1)
#: A rebuilt entry whose retry is overdue gets a last fire time this much before the retry, so
#: beat fires the retry at once instead of moving past it.
RETRY_LEAD = timedelta(milliseconds=1)
ENTRY_PREFIX = "schedule:"
#: Tag of chordbeat's schedule type inside RedBeat's JSON.
SCHEDULE_TYPE = "chordbeat_cadence"


class CadenceSchedule(BaseSchedule):  # type: ignore[misc]
    """A Celery schedule over a :class:`Cadence` (cron in a zone, or anchored interval) and a retry."""

    def __init__(self, cadence: Cadence, retry_at: datetime | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cadence = cadence
        self.retry_at = retry_at

    def due(self, last_run_at: datetime) -> Due:
        return next_due(self.cadence, last_fired=_aware(last_run_at), retry_at=self.retry_at)

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        now: datetime = self.now()
        return self.due(last_run_at).at - now

    def is_due(self, last_run_at: datetime) -> schedstate:
        now: datetime = self.now()
        due = self.due(last_run_at)
        if due.at <= now:
            return schedstate(True, max((self.due(now).at - now).total_seconds(), 0.1))
        return schedstate(False, (due.at - now).total_seconds())

    def encode(self) -> dict[str, Any]:
        return {
            "__type__": SCHEDULE_TYPE,
            "cron": self.cadence.cron,
            "every": self.cadence.every_s,
            "timezone": self.cadence.timezone,
            "anchor": self.cadence.anchor.timestamp(),
            "retry_at": self.retry_at.timestamp() if self.retry_at else None,
        }

    @classmethod
    def decode(cls, data: dict[str, Any]) -> CadenceSchedule:
        cadence = Cadence(
            cron=data["cron"],
            every_s=data["every"],
            timezone=data["timezone"],
            anchor=datetime.fromtimestamp(data["anchor"], UTC),
        )
        retry = data.get("retry_at")
        return cls(cadence, datetime.fromtimestamp(retry, UTC) if retry is not None else None)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CadenceSchedule) and self.encode() == other.encode()

    def __hash__(self) -> int:
        return hash(json.dumps(self.encode(), sort_keys=True))

    def __repr__(self) -> str:
        what = self.cadence.cron and f"cron {self.cadence.cron!r} {self.cadence.timezone}"
        return f"<CadenceSchedule {what or f'every {self.cadence.every_s}s'}>"


def fire_of(
    schedule: CadenceSchedule, last_run_at: datetime | None, name: str, now: datetime
) -> tuple[dict[str, str], datetime | None]:
    """The slot a due entry fires, as its fire message states it, and when that message expires."""
    last = _aware(last_run_at or now)
    due = schedule.due(last)
    if due.retry:
        return {"name": name, "nominal_at": due.at.isoformat(), "trigger": Trigger.RETRY.value}, None
    nominal = schedule.cadence.latest_slot(now, since=last) or due.at
    trigger = Trigger.CRON if schedule.cadence.cron else Trigger.INTERVAL
    # Once the next slot is due, this fire is superseded (decide_fire); a backlog of them after
    # a worker outage is dropped by the broker instead of being worked off.
    expires = schedule.cadence.slot_after(nominal) + FIRE_EXPIRY_GRACE
    return {"name": name, "nominal_at": nominal.isoformat(), "trigger": trigger.value}, expires


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


class EntryEncoder(RedBeatJSONEncoder):  # type: ignore[misc]
    def default(self, obj: Any) -> Any:
        if isinstance(obj, CadenceSchedule):
            return obj.encode()
        return super().default(obj)


class EntryDecoder(RedBeatJSONDecoder):  # type: ignore[misc]
    def dict_to_object(self, d: dict[str, Any]) -> Any:
        if d.get("__type__") == SCHEDULE_TYPE:
            return CadenceSchedule.decode(d)
        return super().dict_to_object(d)


class ScheduleEntry(RedBeatSchedulerEntry):  # type: ignore[misc]
    """RedBeat's entry, storing :class:`CadenceSchedule` and scoring it by its exact due time."""

    @staticmethod
    def decode_definition(definition: str) -> Any:
        return json.loads(definition, cls=EntryDecoder)

    @classmethod
    def from_stored(cls, definition: str, meta: str | None, app: Celery) -> ScheduleEntry:
        """The entry from its two stored fields (RedBeat's ``from_key`` without its round trip)."""
        fields = cls.decode_definition(definition)
        last = cls.decode_meta(meta)
        fields.update(last)
        entry = cls(app=app, **fields)
        entry.last_run_at = last["last_run_at"]  # Celery's entry would set "now"
        return entry

    def reserve_in(self, pipe: Any) -> ScheduleEntry:
        """RedBeat's reserve (the entry fired now: its last fire time and score move on), written
        into ``pipe`` instead of a round trip of its own."""
        entry: ScheduleEntry = BaseScheduleEntry._next_instance(self)
        meta = {"last_run_at": entry.last_run_at, "total_run_count": entry.total_run_count}
        pipe.hset(self.key, "meta", json.dumps(meta, cls=RedBeatJSONEncoder))
        pipe.zadd(self.app.redbeat_conf.schedule_key, {entry.key: entry.score})
        return entry

    @property
    def due_at(self) -> datetime | None:
        if not isinstance(self.schedule, CadenceSchedule):
            return super().due_at  # type: ignore[no-any-return]
        if self.last_run_at is None:
            return self._default_now()  # type: ignore[no-any-return]
        return self.schedule.due(self.last_run_at).at

    @property
    def score(self) -> float:
        """The exact due time. RedBeat scores whole seconds, so an entry due at 12:00:00.700 would be
        loaded (one round trip) on every tick from 12:00:00 on: with thousands of entries staggered
        over a minute, most of beat's CPU went into reloading entries not yet due."""
        due = self.due_at
        return -1.0 if due is None else _aware(due).timestamp()

    def definition_json(self) -> str:
        return json.dumps(
            {
                "name": self.name,
                "task": self.task,
                "args": self.args,
                "kwargs": self.kwargs,
                "options": self.options,
                "schedule": self.schedule,
                "enabled": self.enabled,
            },
            cls=EntryEncoder,
        )

    def save(self, *, reset_last_run: bool = False) -> ScheduleEntry:
        """Write the definition; keep the last fire time unless ``reset_last_run`` (new cadence)."""
        meta = json.dumps({"last_run_at": self.last_run_at}, cls=EntryEncoder)
        with get_redis(self.app).pipeline() as pipe:
            pipe.hset(self.key, "definition", self.definition_json())
            if reset_last_run:
                pipe.hset(self.key, "meta", meta)
            else:
                pipe.hsetnx(self.key, "meta", meta)
            pipe.execute()
        # Score from what is stored now (the kept last fire time), in whole seconds as RedBeat needs.
        stored = ScheduleEntry.from_key(self.key, app=self.app)
        get_redis(self.app).zadd(self.app.redbeat_conf.schedule_key, {self.key: stored.score})
        return self


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


#: The columns a beat entry is made of, in EntryFields' order (the fire path reads them too).
ENTRY_COLUMNS = (
    Schedule.name,
    Schedule.status,
    Schedule.cron,
    Schedule.every_s,
    Schedule.timezone,
    Schedule.updated_at,
    Schedule.retry_at,
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


def cadence_of(schedule: Schedule | EntryFields) -> Cadence:
    return Cadence(cron=schedule.cron, every_s=schedule.every_s, timezone=schedule.timezone, anchor=schedule.updated_at)


def desired_entry(app: Celery, schedule: Schedule | EntryFields, now: datetime) -> ScheduleEntry | None:
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
        # Nobody reads a fire's answer: no result key kept for a day per slot.
        options={"queue": keys.CONTROL_QUEUE, "ignore_result": True},
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
    return {k: v for k, v in schedule.items() if k != "retry_at"} if isinstance(schedule, dict) else schedule


def _entry_fields(app: Celery, names: Sequence[str]) -> dict[str, EntryFields]:
    with transaction(app.settings.database_url, read_only=True) as session:
        rows = session.execute(select(*ENTRY_COLUMNS).where(Schedule.name.in_(names))).all()
    return {row.name: EntryFields(*row) for row in rows}


def sync_schedules(app: Celery, names: Iterable[str]) -> EntryChanges:
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


def _sync_chunk(app: Celery, names: Sequence[str], now: datetime, changes: EntryChanges) -> None:
    found = _entry_fields(app, names)
    desired: dict[str, ScheduleEntry | None] = {}
    for name in names:
        try:
            desired[name] = desired_entry(app, found[name], now) if name in found else None
        except Exception:
            # One unreadable schedule (a corrupt row) must not stop every other entry's repair.
            logger.exception("beat entry of schedule %r cannot be built; left as it is", name)
    client = get_redis(app)
    index_key = app.redbeat_conf.schedule_key
    entry_keys = {name: ScheduleEntry.generate_key(app, entry_name(name)) for name in desired}
    with client.pipeline(transaction=False) as pipe:
        for key in entry_keys.values():
            pipe.hmget(key, "definition", "meta")
            pipe.zscore(index_key, key)
        replies = pipe.execute()
    with client.pipeline(transaction=False) as pipe:
        for position, (name, entry) in enumerate(desired.items()):
            (stored, meta), score = replies[2 * position], replies[2 * position + 1]
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
    app: Celery,
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
    kept = ScheduleEntry.decode_meta(meta).get("last_run_at") if stored is not None else None
    same_cadence = kept is not None and stored is not None and _cadence_part(stored) == _cadence_part(wanted)
    if same_cadence:
        # Same cadence: keep when beat last fired it (a changed retry time only adds a due time).
        entry.last_run_at = kept
    new_meta = json.dumps({"last_run_at": entry.last_run_at}, cls=EntryEncoder)
    new_score = entry.score  # computed before anything is queued: a bad entry queues nothing
    pipe.hset(key, "definition", wanted)
    if same_cadence:
        pipe.hsetnx(key, "meta", new_meta)  # beat may have fired it meanwhile: its time wins
    else:
        pipe.hset(key, "meta", new_meta)
    pipe.zadd(index_key, {key: new_score})


#: A slot beat has passed but the database never saw fired is re-fired after this long.
LOST_FIRE_GRACE = timedelta(seconds=30)
#: A slot is re-fired at most once: a fire merely queued behind others (overload) must not be
#: doubled every pass.
REFIRED_KEY = "refired:"


@dataclass(frozen=True)
class _Overdue:
    name: str
    cadence: Cadence
    slot: datetime
    retry: bool


def refire_lost_slots(app: Celery, now: datetime | None = None) -> list[str]:
    """Fire again the slots and retries beat moved past whose fire message never arrived.

    RedBeat records a fire before publishing it, so a failed publish (or Redis losing the message,
    or entries rebuilt after a Redis restart) would lose that run. The database knows it was due
    (``next_run_at``, or a pending retry's ``retry_at``, in the past) and the entry knows beat moved
    past it. A regular slot is re-fired as the latest slot beat passed (an older one would be
    superseded by it); a retry only when no run of the schedule is in progress (the end of that
    run starts it). Run keys make a late original and this re-fire one execution.
    """
    ensure_conf(app)
    now = now or utcnow()
    horizon = now - LOST_FIRE_GRACE
    due: list[_Overdue] = []
    with transaction(app.settings.database_url, read_only=True) as session:
        overdue = session.execute(
            select(
                Schedule.id,
                Schedule.current_retry,
                Schedule.next_run_at,
                *ENTRY_COLUMNS,
            ).where(
                Schedule.status == ScheduleStatus.ACTIVE,
                or_(
                    and_(Schedule.retry_at.is_(None), Schedule.next_run_at < horizon),
                    Schedule.retry_at < horizon,
                ),
            )
        ).all()
        for row in overdue:
            fields = EntryFields(
                row.name, row.status, row.cron, row.every_s, row.timezone, row.updated_at, row.retry_at
            )
            if row.retry_at is None:
                due.append(_Overdue(row.name, cadence_of(fields), row.next_run_at, False))
                continue
            key = run_key(row.name, Trigger.RETRY, row.retry_at, row.current_retry)
            ran_or_busy = session.scalar(
                select(ScheduleExecution.id)
                .where(
                    ScheduleExecution.schedule_id == row.id,
                    or_(ScheduleExecution.run_key == key, ScheduleExecution.status == ExecutionStatus.IN_PROGRESS),
                )
                .limit(1)
            )
            if ran_or_busy is None:
                due.append(_Overdue(row.name, cadence_of(fields), row.retry_at, True))
    refired: list[str] = []
    client = get_redis(app)
    for start in range(0, len(due), CHUNK):
        batch = due[start : start + CHUNK]
        with client.pipeline(transaction=False) as pipe:
            for item in batch:
                pipe.hget(ScheduleEntry.generate_key(app, entry_name(item.name)), "meta")
            metas = pipe.execute()
        for item, meta in zip(batch, metas, strict=True):
            try:
                if _refire(app, item, ScheduleEntry.decode_meta(meta).get("last_run_at")):
                    refired.append(item.name)
            except redis.RedisError:
                raise
            except Exception:
                logger.exception("lost slot of schedule %r cannot be re-fired; the others are", item.name)
    if refired:
        logger.warning("re-fired slots whose fire message was lost: %s", few(refired))
    return refired


def _refire(app: Celery, item: _Overdue, last_run_at: datetime | None) -> bool:
    """Fire ``item.slot`` again if beat moved past it (the database never saw it fired)."""
    if last_run_at is None or _aware(last_run_at) < item.slot:
        return False  # beat has not reached the slot yet (it is down, or behind): it will fire it
    options: dict[str, Any] = {"queue": keys.CONTROL_QUEUE, "ignore_result": True}
    if item.retry:
        nominal, trigger = item.slot, Trigger.RETRY
    else:
        cadence = item.cadence
        nominal = cadence.latest_slot(_aware(last_run_at), since=item.slot - timedelta(microseconds=1)) or item.slot
        trigger = Trigger.CRON if cadence.cron else Trigger.INTERVAL
        options["expires"] = cadence.slot_after(nominal) + FIRE_EXPIRY_GRACE
    marker = app.redbeat_conf.key_prefix + REFIRED_KEY + run_key(item.name, trigger, nominal)
    if not get_redis(app).set(marker, "1", nx=True, ex=int(LOST_FIRE_GRACE.total_seconds() * 20)):
        return False  # re-fired once already: that fire is still queued (overload) or ran meanwhile
    app.send_task(
        FIRE_TASK,
        kwargs={"name": item.name, "nominal_at": nominal.isoformat(), "trigger": trigger.value},
        **options,
    )
    return True


def _watermark(value: str | None) -> datetime | None:
    try:
        return datetime.fromtimestamp(float(value), UTC) if value is not None else None
    except (TypeError, ValueError, OverflowError):
        return None


def reconcile(app: Celery, *, full: bool = False) -> EntryChanges:
    """Repair drift both ways: missing or stale entries written, orphaned ones removed.

    Periodically it looks only at schedules changed (``changed_at``) since its previous pass; a
    full pass (beat's start, a lost lock, Redis restarted, no previous pass recorded) compares every
    active schedule and every entry in RedBeat's index (never a scan of the Redis database).
    Schedules deleted without their entry going too are cleaned up by their next fire.
    """
    ensure_conf(app)
    client = get_redis(app)
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
        logger.warning("beat entries repaired: written %s; removed %s", few(changes.written), few(changes.removed))
    return changes


#: Names a log line lists at most (a first full pass may write tens of thousands of entries).
LOGGED_NAMES = 20


def few(names: Sequence[str]) -> str:
    if len(names) <= LOGGED_NAMES:
        return ", ".join(names) or "-"
    return f"{', '.join(names[:LOGGED_NAMES])} and {len(names) - LOGGED_NAMES} more"
