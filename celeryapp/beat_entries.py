"""RedBeat entries of schedules: a schedule type RedBeat can store, and syncing entries with the DB.

Every active schedule has exactly one dynamic RedBeat entry (``<prefix>schedule:<name>``) that
sends ``chordbeat.fire_schedule``. Entries are written whenever a schedule changes and repaired
by :func:`reconcile`, so the database stays the source of truth.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import redis
from celery import Celery
from celery.schedules import BaseSchedule, schedstate
from redbeat.decoder import RedBeatJSONDecoder, RedBeatJSONEncoder
from redbeat.schedulers import RedBeatSchedulerEntry, ensure_conf, get_redis
from sqlalchemy import and_, or_, select

from celeryapp import keys
from celeryapp.cadence import Cadence, Due, next_due
from celeryapp.runs import run_key
from models import ExecutionStatus, Schedule, ScheduleExecution, ScheduleStatus, Trigger, transaction

logger = logging.getLogger(__name__)

FIRE_TASK = "chordbeat.fire_schedule"
#: A regular slot's fire message expires this long after the next slot is due. By then it is
#: superseded anyway (:func:`celeryapp.decisions.decide_fire`); the grace lets a late one still
#: record its slot as superseded, and covers clock differences between beat and workers.
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

    @property
    def due_at(self) -> datetime | None:
        if not isinstance(self.schedule, CadenceSchedule):
            return super().due_at  # type: ignore[no-any-return]
        if self.last_run_at is None:
            return self._default_now()  # type: ignore[no-any-return]
        return self.schedule.due(self.last_run_at).at

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


def cadence_of(schedule: Schedule) -> Cadence:
    return Cadence(cron=schedule.cron, every_s=schedule.every_s, timezone=schedule.timezone, anchor=schedule.updated_at)


def desired_entry(app: Celery, schedule: Schedule, now: datetime) -> ScheduleEntry | None:
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


def _write(app: Celery, schedule_name: str, desired: ScheduleEntry | None, changes: EntryChanges) -> None:
    client = get_redis(app)
    key = ScheduleEntry.generate_key(app, entry_name(schedule_name))
    stored = client.hget(key, "definition")
    if desired is None:
        if stored is not None or client.zscore(app.redbeat_conf.schedule_key, key) is not None:
            with client.pipeline() as pipe:
                pipe.zrem(app.redbeat_conf.schedule_key, key)
                pipe.delete(key)
                pipe.execute()
            changes.removed.append(schedule_name)
        return
    wanted = desired.definition_json()
    if stored == wanted and client.zscore(app.redbeat_conf.schedule_key, key) is not None:
        return
    new_cadence = stored is None or _cadence_part(stored) != _cadence_part(wanted)
    desired.save(reset_last_run=new_cadence)
    changes.written.append(schedule_name)


def _cadence_part(definition: str) -> Any:
    schedule = json.loads(definition).get("schedule", {})
    return {k: v for k, v in schedule.items() if k != "retry_at"} if isinstance(schedule, dict) else schedule


def sync_schedules(app: Celery, names: Iterable[str]) -> EntryChanges:
    """Bring the RedBeat entries of these schedules in line with the database."""
    ensure_conf(app)
    names = sorted(set(names))
    changes = EntryChanges()
    if not names:
        return changes
    now = datetime.now(UTC)
    desired: dict[str, ScheduleEntry | None] = {}
    with transaction(app.settings.database_url, read_only=True) as session:
        found = {s.name: s for s in session.scalars(select(Schedule).where(Schedule.name.in_(names)))}
        for name in names:
            try:
                desired[name] = desired_entry(app, found[name], now) if name in found else None
            except Exception:
                # One unreadable schedule (a corrupt row) must not stop every other entry's repair.
                logger.exception("beat entry of schedule %r cannot be built; left as it is", name)
    for name, entry in desired.items():
        try:
            _write(app, name, entry, changes)
        except redis.RedisError:
            raise  # Redis away: the whole pass is retried later
        except Exception:
            logger.exception("beat entry of schedule %r cannot be written; left as it is", name)
    return changes


#: A slot beat has passed but the database never saw fired is re-fired after this long.
LOST_FIRE_GRACE = timedelta(seconds=30)


def refire_lost_slots(app: Celery, now: datetime | None = None) -> list[str]:
    """Fire again the slots and retries beat moved past whose fire message never arrived.

    RedBeat records a fire before publishing it, so a failed publish (or Redis losing the message,
    or entries rebuilt after a Redis restart) would lose that run. The database knows it was due
    (``next_run_at``, or a pending retry's ``retry_at``, in the past) and the entry knows beat moved
    past it. A regular slot is re-fired as the latest slot beat passed (an older one would be
    superseded by it); a retry only when no run of the schedule is in progress (the end of that
    run starts it). Run keys make a late original and this re-fire one execution.
    """
    now = now or datetime.now(UTC)
    horizon = now - LOST_FIRE_GRACE
    due: list[tuple[str, Cadence, datetime, bool]] = []
    with transaction(app.settings.database_url, read_only=True) as session:
        overdue = session.scalars(
            select(Schedule).where(
                Schedule.status == ScheduleStatus.ACTIVE,
                or_(
                    and_(Schedule.retry_at.is_(None), Schedule.next_run_at < horizon),
                    Schedule.retry_at < horizon,
                ),
            )
        ).all()
        for schedule in overdue:
            if schedule.retry_at is None:
                assert schedule.next_run_at is not None  # selected by next_run_at < ...
                due.append((schedule.name, cadence_of(schedule), schedule.next_run_at, False))
                continue
            key = run_key(schedule.name, Trigger.RETRY, schedule.retry_at, schedule.current_retry)
            ran_or_busy = session.scalar(
                select(ScheduleExecution.id)
                .where(
                    ScheduleExecution.schedule_id == schedule.id,
                    or_(ScheduleExecution.run_key == key, ScheduleExecution.status == ExecutionStatus.IN_PROGRESS),
                )
                .limit(1)
            )
            if ran_or_busy is None:
                due.append((schedule.name, cadence_of(schedule), schedule.retry_at, True))
    refired = []
    for name, cadence, slot, retry in due:
        try:
            if _refire(app, name, cadence, slot, retry):
                refired.append(name)
        except redis.RedisError:
            raise
        except Exception:
            logger.exception("lost slot of schedule %r cannot be re-fired; the others are", name)
    if refired:
        logger.warning("re-fired slots whose fire message was lost: %s", ", ".join(refired))
    return refired


def _refire(app: Celery, name: str, cadence: Cadence, slot: datetime, retry: bool) -> bool:
    """Fire ``slot`` again if beat moved past it (the database never saw it fired)."""
    key = ScheduleEntry.generate_key(app, entry_name(name))
    last_run_at = ScheduleEntry.load_meta(key, app=app).get("last_run_at")
    if last_run_at is None or _aware(last_run_at) < slot:
        return False  # beat has not reached the slot yet (it is down, or behind): it will fire it
    if retry:
        nominal, trigger = slot, Trigger.RETRY
    else:
        nominal = cadence.latest_slot(_aware(last_run_at), since=slot - timedelta(microseconds=1)) or slot
        trigger = Trigger.CRON if cadence.cron else Trigger.INTERVAL
    app.send_task(
        FIRE_TASK,
        kwargs={"name": name, "nominal_at": nominal.isoformat(), "trigger": trigger.value},
        queue=keys.CONTROL_QUEUE,
    )
    return True


def reconcile(app: Celery) -> EntryChanges:
    """Repair drift both ways: missing or stale entries written, orphaned ones removed."""
    ensure_conf(app)
    client = get_redis(app)
    prefix = app.redbeat_conf.key_prefix + ENTRY_PREFIX
    present = {key[len(prefix) :] for key in client.scan_iter(match=prefix + "*", count=500)}
    present |= {
        key[len(prefix) :] for key in client.zrange(app.redbeat_conf.schedule_key, 0, -1) if key.startswith(prefix)
    }
    with transaction(app.settings.database_url, read_only=True) as session:
        active = list(session.scalars(select(Schedule.name).where(Schedule.status == ScheduleStatus.ACTIVE)))
    changes = sync_schedules(app, present | set(active))
    if not changes.empty:
        logger.warning("beat entries repaired: written %s; removed %s", changes.written or "-", changes.removed or "-")
    return changes
