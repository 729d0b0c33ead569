"""One Redis client per URL and process: a server's, or the primary's that Sentinels name.

Either way the client follows a failover: Sentinel's connections ask the Sentinels again when the
primary they knew answers ``READONLY`` or is gone, and a plain URL's connections drop themselves on
``READONLY`` (:mod:`celeryapp.messaging.failover`) and reconnect to wherever its name now points.
Whatever goes wrong building or using a client is a :class:`redis.RedisError`, which every caller
already rides out; nothing else escapes to crash recovery, beat or a step's watch.
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

from celeryapp.messaging.failover import connection_class
from celeryapp.redis_urls import DEFAULT_SENTINEL_MASTER, check_redis_url, is_sentinel, parse_sentinels

#: Seconds a command may wait for its answer (then retried once on a fresh connection).
SOCKET_TIMEOUT_S = 10.0
#: Seconds to establish a connection, to a Sentinel or to Redis.
CONNECT_TIMEOUT_S = 5.0
#: Seconds a pooled connection may sit idle before it is pinged before use.
HEALTH_CHECK_INTERVAL_S = 25

_lock = threading.Lock()
_clients: dict[tuple[int, str, str], redis.Redis] = {}
_sentinel_master = DEFAULT_SENTINEL_MASTER


class UnusableRedisUrl(redis.RedisError):
    """A Redis URL no client can be built from (the settings check it at start-up)."""


def use_sentinel_master(name: str) -> None:
    """The primary's name for clients built from Sentinel lists from now on (the app's setting)."""
    global _sentinel_master
    _sentinel_master = name


def _options() -> dict[str, Any]:
    return {
        "decode_responses": True,
        "socket_timeout": SOCKET_TIMEOUT_S,
        "socket_connect_timeout": CONNECT_TIMEOUT_S,
        "health_check_interval": HEALTH_CHECK_INTERVAL_S,
        "retry_on_timeout": True,
    }


def sentinel_options() -> dict[str, Any]:
    """How the Sentinels themselves are asked: one that hangs is given up on like Redis, and one
    that refuses connections is tried twice, not redis-py's ten times backing off (about 4 s
    before the next Sentinel is asked, at every connection while it is down)."""
    return {
        "socket_timeout": SOCKET_TIMEOUT_S,
        "socket_connect_timeout": CONNECT_TIMEOUT_S,
        "retry": Retry(NoBackoff(), 1),
    }


def _build(url: str, master: str) -> redis.Redis:
    try:
        check_redis_url(url)
    except ValueError as exc:
        raise UnusableRedisUrl(f"unusable Redis URL: {exc}") from None
    if not is_sentinel(url):
        return redis.Redis.from_url(url, connection_class=connection_class(url), **_options())
    sentinels = parse_sentinels(url)
    credentials = {"username": sentinels.username, "password": sentinels.password}
    manager = Sentinel(list(sentinels.addresses), sentinel_kwargs=sentinel_options(), **_options())  # type: ignore[no-untyped-call]
    client: redis.Redis = manager.master_for(master, db=sentinels.db, **credentials)  # type: ignore[no-untyped-call]
    return client


def get_redis(url: str) -> redis.Redis:
    """This process's client for ``url``. (RedBeat's ``get_redis(app)`` is another function,
    imported as ``redbeat_client``; for our app it answers this one for the RedBeat URL.)"""
    key = (os.getpid(), url, _sentinel_master)
    with _lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = _build(url, _sentinel_master)
    return client


@functools.lru_cache(maxsize=16)
def registered_script(client: redis.Redis, text: str) -> Any:
    """A Lua script of ``client``'s, hashed once rather than at every call (sent as EVALSHA: its
    text travels once per server)."""
    return client.register_script(text)


def reset_clients() -> None:
    with _lock:
        _clients.clear()
