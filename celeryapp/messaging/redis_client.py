"""One Redis client per URL and process."""

from __future__ import annotations

import os
import threading

import redis

_lock = threading.Lock()
_clients: dict[tuple[int, str], redis.Redis] = {}


def get_redis(url: str) -> redis.Redis:
    key = (os.getpid(), url)
    with _lock:
        client = _clients.get(key)
        if client is None:
            client = redis.Redis.from_url(
                url,
                decode_responses=True,
                socket_timeout=10,
                socket_connect_timeout=5,
                health_check_interval=25,
                retry_on_timeout=True,
            )
            _clients[key] = client
    return client


def reset_clients() -> None:
    with _lock:
        _clients.clear()
