"""A beat entry as RedBeat stores it in Redis, reading one back without trusting it, and the slot it fires.

An entry is a hash of two JSON fields, ``definition`` (what to fire, and its schedule) and ``meta``
(when beat last fired it). Anyone who can write to Redis (or a bit flip, or an older version's
format) can leave something else there; beat reads entries on every tick, and an entry it could
not read made the tick raise and beat exit: every schedule stopped. Reading one either gives an
entry beat can work with or raises :class:`CorruptEntry`, and the caller drops it (the database
is the source of truth: the reconcile writes it again).
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from typing import Any, TypeGuard
from zoneinfo import ZoneInfo

import redis
from celery.schedules import BaseSchedule, schedstate
from redbeat.decoder import RedBeatJSONDecoder, RedBeatJSONEncoder
from redbeat.schedulers import RedBeatSchedulerEntry
from redbeat.schedulers import get_redis as redbeat_client

from celeryapp.domain import limits
from celeryapp.domain.cadence import Cadence, Due, next_due
from celeryapp.domain.cron import CronExpression
from celeryapp.domain.definition import MAX_ZONE_CHARS
from celeryapp.domain.dst_rules import DstRules
from celeryapp.errors import ChordbeatError
from celeryapp.messaging.serialization import MAX_MESSAGE_DEPTH, too_deep
from celeryapp.runtime import Runtime
from models import Trigger

#: Tag of chordbeat's schedule type inside RedBeat's JSON.
SCHEDULE_TYPE = "chordbeat_cadence"
#: The fields of a stored definition (RedBeat's): any other would reach the entry's constructor.
DEFINITION_FIELDS = frozenset({"name", "task", "args", "kwargs", "options", "schedule", "enabled"})
#: A regular slot's fire message expires this long after the next slot is due. By then it is
#: superseded anyway (:func:`celeryapp.domain.decisions.decide_fire`); the grace lets a late one still
#: record its slot as superseded. (Beat and workers reckon it by the same reference clock.)
FIRE_EXPIRY_GRACE = timedelta(minutes=1)
#: Stored instants (anchors, retries, last fires) lie between these, in seconds since the epoch: far
#: beyond any real one, and far enough inside datetime's range that slots reckoned from them fit.
MIN_INSTANT_S = 0.0
MAX_INSTANT_S = datetime(9000, 1, 1, tzinfo=UTC).timestamp()
#: Redis's answer to a hash command on a key holding another type.
WRONG_TYPE = "WRONGTYPE"


class CorruptEntry(ChordbeatError, ValueError):
    """A stored beat entry that cannot be read as one."""


def wrong_type(reply: Any) -> bool:
    """Whether a pipeline's reply (``raise_on_error=False``) is Redis refusing a hash command on a
    key of another type: not an entry. Any other error is raised."""
    return isinstance(check_reply(reply, WRONG_TYPE), redis.ResponseError)


def check_reply(reply: Any, allowed: str | None = None) -> Any:
    """A pipeline's reply (``raise_on_error=False``); an error is raised, but for one that starts
    with ``allowed``, returned."""
    if isinstance(reply, redis.ResponseError) and allowed is not None and str(reply).startswith(allowed):
        return reply
    if isinstance(reply, Exception):
        raise reply
    return reply


class CadenceSchedule(BaseSchedule):  # type: ignore[misc]
    """A Celery schedule over a :class:`Cadence` (cron in a zone, or anchored interval) and a retry."""

    def __init__(self, cadence: Cadence, retry_at: datetime | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cadence = cadence
        self.retry_at = retry_at
        self._dues: dict[datetime, Due] = {}

    def due(self, last_run_at: datetime) -> Due:
        # A tick asks each entry's due time after its last fire and after now twice each (is it
        # due, the slot it fires, its next score): reckoned once (the entry lives one tick).
        known = self._dues.get(last_run_at)
        if known is None:
            if len(self._dues) >= 4:
                self._dues.clear()  # a schedule kept longer (and asked of other times) stays small
            known = self._dues[last_run_at] = next_due(
                self.cadence, last_fired=aware(last_run_at), retry_at=self.retry_at
            )
        return known

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
        # An unset field is left out (read back as None): every byte is paid once per schedule
        # in Redis (docs/scaling.md, "Redis memory").
        encoded: dict[str, Any] = {"__type__": SCHEDULE_TYPE}
        if self.cadence.cron is not None:
            encoded["cron"] = self.cadence.cron
        else:
            encoded["every"] = self.cadence.every_s
        encoded["timezone"] = self.cadence.timezone
        encoded["anchor"] = self.cadence.anchor.timestamp()
        if self.retry_at is not None:
            encoded["retry_at"] = self.retry_at.timestamp()
        if self.cadence.dst is not None:
            encoded["dst"] = self.cadence.dst.to_json()
        return encoded

    @classmethod
    def decode(cls, data: dict[str, Any]) -> CadenceSchedule:
        """The schedule ``encode`` wrote; :class:`CorruptEntry` for anything else (every field is
        checked the way a definition's are, or beat would fail on it later, at every tick)."""
        cron, every = data.get("cron"), data.get("every")
        if (cron is None) == (every is None):
            raise CorruptEntry("its schedule needs exactly one of cron and every")
        if cron is not None:
            if not isinstance(cron, str) or len(cron) > limits.MAX_CRON_CHARS:
                raise CorruptEntry("its cron is not a cron expression")
            CronExpression.parse(cron)  # CronError, a ValueError: reported by the caller
        elif not _number(every) or not limits.MIN_EVERY_S <= every <= limits.MAX_EVERY_S:
            raise CorruptEntry(f"its interval {every!r} is not {limits.MIN_EVERY_S}-{limits.MAX_EVERY_S} s")
        timezone = data.get("timezone")
        if not isinstance(timezone, str) or len(timezone) > MAX_ZONE_CHARS:
            raise CorruptEntry("its time zone is not a zone name")
        ZoneInfo(timezone)  # unknown: ZoneInfoNotFoundError, reported by the caller
        retry = data.get("retry_at")
        anchor = _instant(data.get("anchor"), "anchor")
        cadence = Cadence(cron=cron, every_s=every, timezone=timezone, anchor=anchor, dst=_dst(data.get("dst"), cron))
        return cls(cadence, _instant(retry, "retry_at") if retry is not None else None)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CadenceSchedule) and self.encode() == other.encode()

    def __hash__(self) -> int:
        return hash(json.dumps(self.encode(), sort_keys=True))

    def __repr__(self) -> str:
        what = self.cadence.cron and f"cron {self.cadence.cron!r} {self.cadence.timezone}"
        return f"<CadenceSchedule {what or f'every {self.cadence.every_s}s'}>"


def _number(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _dst(value: Any, cron: str | None) -> DstRules | None:
    if value is None:
        return None
    try:
        rules = DstRules.from_json(value)
    except (TypeError, ValueError):
        raise CorruptEntry("its dst is not a DST rule") from None
    if cron is None or rules is None or rules == DstRules():
        raise CorruptEntry("its dst is not a DST rule of a cron")
    return rules


def _instant(value: Any, field: str) -> datetime:
    if not _number(value) or not MIN_INSTANT_S <= value <= MAX_INSTANT_S:
        raise CorruptEntry(f"its {field} {value!r} is not a time")
    return datetime.fromtimestamp(value, UTC)


def fire_of(
    schedule: CadenceSchedule, last_run_at: datetime | None, name: str, now: datetime
) -> tuple[dict[str, str], datetime | None]:
    """The slot a due entry fires, as its fire message states it, and when that message expires."""
    last = aware(last_run_at or now)
    due = schedule.due(last)
    if due.retry:
        return {"name": name, "nominal_at": due.at.isoformat(), "trigger": Trigger.RETRY.value}, None
    nominal = schedule.cadence.latest_slot(now, since=last) or due.at
    trigger = Trigger.CRON if schedule.cadence.cron else Trigger.INTERVAL
    # Once the next slot is due, this fire is superseded (decide_fire); a backlog of them after
    # a worker outage is dropped by the broker instead of being worked off.
    expires = schedule.cadence.slot_after(nominal) + FIRE_EXPIRY_GRACE
    return {"name": name, "nominal_at": nominal.isoformat(), "trigger": trigger.value}, expires


def aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def meta_json(last_run_at: datetime | None) -> str:
    """An entry's stored meta: when beat last fired it, in seconds since the epoch (``null``:
    never). RedBeat's form, a datetime object, took 140 bytes more per schedule and a decoding
    hook."""
    if last_run_at is None:
        return '{"last_run_at":null}'
    return f'{{"last_run_at":{aware(last_run_at).timestamp()!r}}}'  # a finite float's repr is JSON


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


#: One decoder and one encoder for every entry: building them per entry was a tenth of the
#: decoding. The encoder writes without spaces (bytes every schedule pays in Redis).
_DECODER = EntryDecoder()
_ENCODER = EntryEncoder(separators=(",", ":"))
#: For the meta beat writes (:func:`meta_json`): no object to type, no hook to call.
_PLAIN = json.JSONDecoder()


def _plain(text: str | bytes) -> Any:
    """``text`` as plain JSON (no type hooks: a C parse), or None if it is not JSON."""
    try:
        return _PLAIN.decode(text if isinstance(text, str) else text.decode())
    except (ValueError, RecursionError):
        return None


def _decoded(text: str | bytes | None, field: str) -> Any:
    """A stored field's JSON, through RedBeat's types and ours, nested no deeper than a message."""
    if text is None:
        raise CorruptEntry(f"its {field} is missing")
    try:
        value = _DECODER.decode(text if isinstance(text, str) else text.decode())
    except RecursionError:
        raise CorruptEntry(f"its {field} nests more than {MAX_MESSAGE_DEPTH} levels deep") from None
    except CorruptEntry as exc:
        raise CorruptEntry(f"its {field}: {exc}") from None
    except Exception as exc:
        # Whatever the text makes json or the type hooks raise (TypeError of datetime(**garbage),
        # ZoneInfoNotFoundError, OverflowError, CronError...): it is not an entry this code wrote.
        raise CorruptEntry(f"its {field} cannot be decoded ({type(exc).__name__}: {exc})") from None
    if too_deep(text, value):
        raise CorruptEntry(f"its {field} nests more than {MAX_MESSAGE_DEPTH} levels deep")
    return value


class ScheduleEntry(RedBeatSchedulerEntry):  # type: ignore[misc]
    """RedBeat's entry, storing :class:`CadenceSchedule` and scoring it by its exact due time."""

    last_run_at: datetime | None

    @staticmethod
    def decode_definition(definition: str | bytes | None) -> dict[str, Any]:
        fields = _decoded(definition, "definition")
        if not isinstance(fields, dict):
            raise CorruptEntry(f"its definition is a JSON {type(fields).__name__}, not an object")
        unknown = set(fields) - DEFINITION_FIELDS
        if unknown:
            raise CorruptEntry(f"its definition has unknown fields {sorted(unknown)!r}")
        if not isinstance(fields.get("name"), str) or not isinstance(fields.get("task"), str):
            raise CorruptEntry("its definition names no entry or no task")
        if not isinstance(fields.get("schedule"), BaseSchedule):
            raise CorruptEntry("its definition has no schedule")
        for name, kind in (("args", (list, tuple)), ("kwargs", dict), ("options", dict)):
            if fields.get(name) is not None and not isinstance(fields[name], kind):
                raise CorruptEntry(f"its {name} is a {type(fields[name]).__name__}")
        if not isinstance(fields.get("enabled", True), bool):
            raise CorruptEntry("its enabled is not true or false")
        return fields

    @staticmethod
    def decode_meta(meta: str | bytes | None, app: Runtime | None = None) -> dict[str, Any]:
        """When beat last fired the entry (``None``: never); :class:`CorruptEntry` if unreadable."""
        if not meta:
            return {"last_run_at": None}
        plain = _plain(meta)
        if isinstance(plain, dict) and len(plain) == 1 and _number(plain.get("last_run_at")):
            return {"last_run_at": _instant(plain["last_run_at"], "last fire time")}  # what meta_json writes
        last = _decoded(meta, "meta")
        if isinstance(last, dict) and _number(last.get("last_run_at")):
            # Written as seconds since the epoch (meta_json); RedBeat's own writes (beat's
            # entries) and a previous version's are a datetime object.
            last["last_run_at"] = _instant(last["last_run_at"], "last fire time")
        if not isinstance(last, dict) or not isinstance(last.get("last_run_at"), (datetime, type(None))):
            raise CorruptEntry("its meta holds no last fire time")
        try:
            at = last["last_run_at"] and aware(last["last_run_at"]).timestamp()
        except (OverflowError, ValueError):
            at = math.nan
        if at is not None:
            _instant(at, "last fire time")
        if not isinstance(last.get("total_run_count", 0), int) or set(last) - {"last_run_at", "total_run_count"}:
            raise CorruptEntry("its meta has unknown or bad fields")
        return last

    @classmethod
    def from_stored(
        cls, definition: str | None, meta: str | None, app: Runtime, key: str | None = None
    ) -> ScheduleEntry:
        """The entry from its two stored fields (RedBeat's ``from_key`` without its round trip);
        :class:`CorruptEntry` if they are not an entry (stored under ``key``, if given)."""
        fields = cls.decode_definition(definition)
        last = cls.decode_meta(meta)
        if key is not None and cls.generate_key(app, fields["name"]) != key:
            # Beat writes an entry's fire times under the key its name makes: another key's.
            raise CorruptEntry(f"its definition names another entry, {fields['name'][:80]!r}")
        fields.update(last)
        entry = cls(app=app, **fields)
        entry.last_run_at = last["last_run_at"]  # Celery's entry would set "now"
        return entry

    @classmethod
    def from_key(cls, key: str, app: Runtime) -> ScheduleEntry:
        """RedBeat's; an unreadable entry is :class:`KeyError` as a missing one is: RedBeat's
        start-up then writes its own entries (recovery, reconcile...) anew."""
        definition, meta = redbeat_client(app).hmget(key, "definition", "meta")
        if not definition:
            raise KeyError(key)
        try:
            return cls.from_stored(definition, meta, app=app, key=key)
        except CorruptEntry as exc:
            raise KeyError(key) from exc

    def moved_on(self, now: datetime) -> tuple[str, float]:
        """RedBeat's reserve of a cadence entry fired at ``now``, as what is to be stored: its new
        meta and score (the caller writes those of a tick's entries together, see
        :mod:`celeryapp.scheduling.fire_messages`). Raises if the next due time cannot be reckoned."""
        assert isinstance(self.schedule, CadenceSchedule)
        return meta_json(now), aware(self.schedule.due(now).at).timestamp()

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
        return -1.0 if due is None else aware(due).timestamp()

    def definition_json(self) -> str:
        """What is stored as the definition; fields at RedBeat's defaults (no arguments or
        options, enabled) are left out, as RedBeat reads them back the same."""
        definition: dict[str, Any] = {"name": self.name, "task": self.task}
        for field, value in (("args", self.args), ("kwargs", self.kwargs), ("options", self.options)):
            if value:
                definition[field] = value
        definition["schedule"] = self.schedule
        if not self.enabled:
            definition["enabled"] = False
        return _ENCODER.encode(definition)  # type: ignore[no-any-return]

    def save(self, *, reset_last_run: bool = False) -> ScheduleEntry:
        """Write the definition; keep the last fire time unless ``reset_last_run`` (new cadence)
        or unreadable."""
        meta = meta_json(self.last_run_at)
        client = redbeat_client(self.app)
        if client.type(self.key) not in ("hash", "none", b"hash", b"none"):
            client.delete(self.key)  # not an entry at all: every hash command on it would fail
        with client.pipeline() as pipe:
            pipe.hset(self.key, "definition", self.definition_json())
            if reset_last_run:
                pipe.hset(self.key, "meta", meta)
            else:
                pipe.hsetnx(self.key, "meta", meta)
            pipe.hget(self.key, "meta")
            *_, kept = pipe.execute()
        ours = self.last_run_at
        try:
            self.last_run_at = self.decode_meta(kept)["last_run_at"]
        except CorruptEntry:
            client.hset(self.key, "meta", meta)
        try:
            # Score from what is stored now (the kept last fire time).
            client.zadd(self.app.redbeat_conf.schedule_key, {self.key: self.score})
        finally:
            self.last_run_at = ours
        return self
