"""What the dashboard's health page reads from Redis and the workers: not in the database."""

from __future__ import annotations

from dataclasses import dataclass, field

import redis
from kombu.exceptions import OperationalError

from celeryapp.app import REDBEAT_LOCK_TIMEOUT_S, ChordbeatCelery
from celeryapp.messaging.keys import CONTROL_QUEUE, PUBLIC_QUEUE, STEPS_QUEUE
from celeryapp.messaging.redis_client import get_redis
from celeryapp.messaging.reference_time import OFFSET_WARNING_S, ProcessOffset, offsets
from models.clock import clock

#: kombu's Redis transport keeps a queue's priority ``n`` (n > 0) messages under ``queue + SEP + n``.
PRIORITY_SEP = "\x06\x16"
PING_TIMEOUT_S = 1.0
#: What a broadcast raises when Redis is away or dropped a pooled connection.
BROKER_ERRORS = (redis.RedisError, OperationalError, OSError)


@dataclass
class BrokerState:
    workers: list[str]
    queues: dict[str, int]
    #: Seconds the beat lock has left; None when nobody holds it.
    lock_ttl_s: float | None
    #: Seconds since the lock holder last extended it (each tick does).
    last_tick_s: float | None
    error: str | None = None
    #: Processes whose host clock is more than OFFSET_WARNING_S off the reference (Redis's).
    clocks_off: list[ProcessOffset] = field(default_factory=list)


def queue_depth(client: redis.Redis, queue: str, priorities: list[int]) -> int:
    with client.pipeline(transaction=False) as pipe:
        for priority in priorities:
            pipe.llen(queue if priority == 0 else f"{queue}{PRIORITY_SEP}{priority}")
        return sum(int(n) for n in pipe.execute())


def broker_state(app: ChordbeatCelery, extra_queues: list[str]) -> BrokerState:
    priorities = list(app.conf.broker_transport_options.get("priority_steps", [0]))
    queues = [CONTROL_QUEUE, PUBLIC_QUEUE, STEPS_QUEUE, *sorted(set(extra_queues) - {STEPS_QUEUE})]
    try:
        client = get_redis(app.settings.broker_url)
        depths = {q: queue_depth(client, q, priorities) for q in queues}
        beat = get_redis(app.settings.redbeat_url)
        ttl_ms = int(beat.pttl(f"{app.conf.redbeat_key_prefix}:lock"))
        clocks_off = [o for o in offsets(client, clock.timestamp()) if abs(o.offset_s) > OFFSET_WARNING_S]
    except redis.RedisError as exc:
        return BrokerState([], {}, None, None, error=f"Redis: {exc}")
    lock_ttl = ttl_ms / 1000 if ttl_ms > 0 else None
    last_tick = None if lock_ttl is None else max(REDBEAT_LOCK_TIMEOUT_S - lock_ttl, 0.0)
    try:
        replies = _ping(app)
    except BROKER_ERRORS as exc:
        return BrokerState([], depths, lock_ttl, last_tick, f"workers could not be asked: {exc}", clocks_off)
    workers = sorted(node for reply in replies for node in reply)
    return BrokerState(workers, depths, lock_ttl, last_tick, clocks_off=clocks_off)


def _ping(app: ChordbeatCelery) -> list[dict[str, object]]:
    """Workers' answers to a ping. A pooled connection Redis closed meanwhile (a restart, an idle
    timeout) fails once; the second try takes a fresh one, so the page is not an error for it."""
    try:
        return app.control.ping(timeout=PING_TIMEOUT_S) or []
    except BROKER_ERRORS:
        return app.control.ping(timeout=PING_TIMEOUT_S) or []
