"""Overload made visible: slots skipped because their schedule's previous run is still active.

Under sustained overload (more due runs than workers finish) a ``skip`` schedule trades runs for
skip records. That must not go unnoticed: every skip is counted in Redis per minute (one pipelined
round trip; minutes of the reference clock, which every process counts by), the first skip of a
minute logs one WARNING for the whole deployment naming the previous minute's skips and the fire
messages waiting, and ``chordbeat metrics`` exports both.
"""

from __future__ import annotations

import logging

import redis

from celeryapp.clock import clock
from celeryapp.domain.names import CONTROL_QUEUE, PREFIX, STEPS_QUEUE
from celeryapp.messaging import keys
from celeryapp.messaging.redis_client import get_redis

logger = logging.getLogger(__name__)

#: Seconds a minute's counter is kept: long enough to be read during the following minute.
COUNTER_TTL_S = 180


def _skipped_key(minute: int) -> str:
    return f"{PREFIX}:overload:skipped:{minute}"


def _warned_key(minute: int) -> str:
    return f"{PREFIX}:overload:warned:{minute}"


def queued(client: redis.Redis, queue: str) -> int:
    """Messages waiting in ``queue`` (all priorities), not counting those a worker holds."""
    with client.pipeline(transaction=False) as pipe:
        for key in keys.queue_keys(queue):
            pipe.llen(key)
        return sum(int(n) for n in pipe.execute())


def note_skipped(broker_url: str, count: int, *, now: float | None = None) -> None:
    """Count ``count`` overlap skips; once a minute, warn if the previous minute had any."""
    minute = int((now if now is not None else clock.timestamp()) // 60)
    client = get_redis(broker_url)
    try:
        with client.pipeline(transaction=False) as pipe:
            pipe.incrby(_skipped_key(minute), count)
            pipe.expire(_skipped_key(minute), COUNTER_TTL_S)
            pipe.set(_warned_key(minute), "1", nx=True, ex=COUNTER_TTL_S)
            pipe.get(_skipped_key(minute - 1))
            _total, _ttl, first_of_minute, previous = pipe.execute()
        if not first_of_minute or not previous:
            return
        logger.warning(
            "overload: %s slots were skipped in the last minute because their schedule's previous run was "
            "still in progress; %s fire and control messages wait in %r and %s step messages in %r. "
            "Add step workers (or a control worker), or make schedules less frequent.",
            int(previous),
            queued(client, CONTROL_QUEUE),
            CONTROL_QUEUE,
            queued(client, STEPS_QUEUE),
            STEPS_QUEUE,
        )
    except redis.RedisError as exc:
        logger.info("overload counter not updated: %s", exc)


def skipped_last_minute(client: redis.Redis, *, now: float | None = None) -> int:
    """Overlap skips in the last complete minute."""
    minute = int((now if now is not None else clock.timestamp()) // 60)
    return int(client.get(_skipped_key(minute - 1)) or 0)
