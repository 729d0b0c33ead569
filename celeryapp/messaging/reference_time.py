"""Redis's ``TIME`` as the deployment's reference clock, and every process's offset from it.

Redis is the one server every chordbeat process talks to, on every database, and the heartbeats'
time to live is already measured by its clock; so it is the reference (:mod:`celeryapp.clock`). Each
process notes its offset in :data:`OFFSETS_KEY` at every reading: a host whose clock is more than
:data:`OFFSET_WARNING_S` off is logged, counted in the metrics and shown on the dashboard's health
page. It does no harm to chordbeat (nothing compares its clock with another's) but it tells of a
broken NTP that the steps' own code, logs and other systems on that host still suffer from.

Redis's clock itself may jump (a failover to a host with another clock, an NTP step): the
deployment's correction (:mod:`celeryapp.clock_correction`) lives in its ``CORRECTION_KEY``,
read in the same round trip as ``TIME`` and written by compare-and-set, so that every process
subtracts the same one.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import redis

from celeryapp.clock import MEASURE_INTERVAL_S, clock
from celeryapp.clock_correction import CORRECTION_KEY, BadCorrection, Correction
from celeryapp.domain.names import PREFIX
from celeryapp.messaging.redis_client import get_redis, registered_script

logger = logging.getLogger(__name__)

#: Hash of process -> its last offset reading (JSON ``{"offset_s": ..., "at": ...}``).
OFFSETS_KEY = f"{PREFIX}:clock:offsets"
#: Compare-and-set of the correction: KEYS[1]; ARGV[1] the record expected ('' for none), ARGV[2]
#: the new one. Returns the record stored afterwards.
_SHARE_LUA = """
local stored = redis.call('GET', KEYS[1])
if (stored or '') == ARGV[1] then
    redis.call('SET', KEYS[1], ARGV[2])
    return ARGV[2]
end
return stored
"""
#: An offset larger than this (either way), in seconds, is warned about.
OFFSET_WARNING_S = 5.0
#: A process still off is warned about again after this many seconds (not at every reading).
WARNING_REPEAT_S = 600.0
#: A process's entry older than this (reference seconds) is gone: the process stopped.
OFFSET_STALE_S = 120.0


@dataclass(frozen=True)
class ProcessOffset:
    process: str
    #: This process's host clock minus the reference, in seconds.
    offset_s: float
    #: Reference time of the reading (seconds since the epoch).
    at: float


class _OffsetReporter:
    """Notes a process's readings in Redis and warns, at most every WARNING_REPEAT_S, while it is off."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._warned_at = float("-inf")
        self._noted_at = float("-inf")

    def __call__(self, offset_s: float, at: float) -> None:
        off = abs(offset_s) > OFFSET_WARNING_S
        if off and time.monotonic() - self._warned_at >= WARNING_REPEAT_S:
            self._warned_at = time.monotonic()
            logger.warning(
                "this host's clock is %.1f s %s Redis's (the reference); chordbeat keeps time by Redis, "
                "but fix the host's time sync: the steps' own code and logs use the host's clock",
                abs(offset_s),
                "ahead of" if offset_s > 0 else "behind",
            )
        elif not off and self._warned_at > float("-inf"):
            self._warned_at = float("-inf")
            logger.info("this host's clock is back within %.1f s of Redis's", OFFSET_WARNING_S)
        # Beat reads the clock every second; what others read of it is fresh enough at this pace.
        if time.monotonic() - self._noted_at >= MEASURE_INTERVAL_S:
            self._noted_at = time.monotonic()
            entry = json.dumps({"offset_s": round(offset_s, 3), "at": at})
            get_redis(self.url).hset(OFFSETS_KEY, process_name(), entry)


def process_name() -> str:
    return f"{socket.gethostname()} pid {os.getpid()}"


def read_reference(url: str) -> float:
    """Redis's time, in seconds since the epoch."""
    seconds, microseconds = get_redis(url).time()
    return float(seconds) + microseconds / 1_000_000


class RedisReference:
    """Redis's ``TIME`` with the deployment's correction beside it (:class:`celeryapp.clock.SharedReference`)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def read(self) -> tuple[float, str | None]:
        return _time_and_record(get_redis(self.url))

    def share(self, expected: str | None, correction: str) -> str | None:
        client = get_redis(self.url)
        return _text(registered_script(client, _SHARE_LUA)(keys=[CORRECTION_KEY], args=[expected or "", correction]))


def _time_and_record(client: redis.Redis) -> tuple[float, str | None]:
    """Redis's raw TIME and the stored correction, in one round trip."""
    with client.pipeline(transaction=False) as pipe:
        pipe.time()
        pipe.get(CORRECTION_KEY)
        (seconds, microseconds), stored = pipe.execute()
    return float(seconds) + microseconds / 1_000_000, _text(stored)


def _text(stored: object) -> str | None:
    if stored is None:
        return None
    return stored.decode("utf-8", "replace") if isinstance(stored, bytes) else str(stored)


def install(url: str) -> None:
    """Make the Redis at ``url`` this process's reference clock (read at first use)."""
    clock.use(RedisReference(url), _OffsetReporter(url))


@dataclass(frozen=True)
class ClockCorrection:
    """The deployment's correction as an operator sees it."""

    correction: Correction
    #: Seconds still subtracted from Redis's clock now (positive: Redis is ahead of chordbeat's time).
    remaining_s: float
    #: Seconds until it is taken back entirely.
    done_in_s: float
    #: chordbeat's time of the last jump.
    jumped_at: datetime


def shared_correction(client: redis.Redis) -> ClockCorrection | None:
    """The deployment's clock correction now (``None``: Redis's clock never jumped, or the record
    is garbled: the processes log that). One round trip: Redis's TIME and the record."""
    raw_s, stored = _time_and_record(client)
    if stored is None:
        return None
    try:
        correction = Correction.from_text(stored)
    except BadCorrection:
        return None
    return ClockCorrection(
        correction,
        correction.remaining_s(raw_s),
        max(0.0, correction.done_at() - raw_s),
        datetime.fromtimestamp(correction.corrected(correction.at_reference_s), UTC),
    )


def offsets(client: redis.Redis, now_s: float) -> list[ProcessOffset]:
    """The processes that noted a reading within :data:`OFFSET_STALE_S`, largest offset first;
    older entries (processes gone) are removed."""
    found, gone = [], []
    for process, raw in client.hgetall(OFFSETS_KEY).items():
        try:
            value = json.loads(raw)
            entry = ProcessOffset(str(process), float(value["offset_s"]), float(value["at"]))
        except (TypeError, ValueError, KeyError):
            gone.append(process)
            continue
        if now_s - entry.at > OFFSET_STALE_S:
            gone.append(process)
        else:
            found.append(entry)
    if gone:
        client.hdel(OFFSETS_KEY, *gone)
    return sorted(found, key=lambda entry: -abs(entry.offset_s))
