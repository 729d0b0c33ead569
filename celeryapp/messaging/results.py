"""Celery's Redis result backend on connections that follow a failover behind a name.

Chords count their finished parts in the result backend; on a pooled connection to a primary that
failed over and came back a replica, every count would fail with ``READONLY`` and the chord's body
would never be sent. The app's loader maps the ``redis``/``rediss`` schemes to this backend; a
``sentinel://`` list keeps Celery's Sentinel backend, whose connections already ask the Sentinels.
"""

from __future__ import annotations

from typing import Any

import redis
from celery.backends.redis import RedisBackend
from celery.loaders.app import AppLoader

from celeryapp.messaging.failover import (
    FailoverConnection,
    FailoverSSLConnection,
    FailoverUnixConnection,
    retry_once_moved,
)

_FAILOVER_CLASSES: dict[type[Any], type[Any]] = {
    redis.Connection: FailoverConnection,
    redis.SSLConnection: FailoverSSLConnection,
    redis.UnixDomainSocketConnection: FailoverUnixConnection,
}


class FailoverRedisBackend(RedisBackend):  # type: ignore[misc]
    def _get_pool(self, **params: Any) -> Any:
        given = params.get("connection_class", redis.Connection)
        params["connection_class"] = _FAILOVER_CLASSES.get(given, given)
        # Celery retries nothing on a connection; a chord's count refused by a demoted primary
        # would fail the chord. (Retrying it after a broken socket could count a part twice.)
        params.setdefault("retry", retry_once_moved())
        return super()._get_pool(**params)


class Loader(AppLoader):  # type: ignore[misc]
    override_backends = {scheme: f"{__name__}:FailoverRedisBackend" for scheme in ("redis", "rediss")}
