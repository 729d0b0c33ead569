"""Redis connections that follow a failover behind a DNS name or a virtual IP.

After a failover the old primary comes back as a replica; a pooled connection to it still works
but every write answers ``READONLY``. redis-py raises :class:`~redis.exceptions.ReadOnlyError`,
a response error, and keeps the connection: every later write on it fails the same way, forever
(beat fires nothing, heartbeats stop and running steps are re-run as lost). These connections
treat the answer as what it means, the primary is elsewhere: they drop themselves and raise a
:class:`~redis.exceptions.ConnectionError`, which the client's retry, kombu and chordbeat's own
handlers already answer by connecting again, to wherever the name now points.
(redis-py's Sentinel connections do the same; these are for plain ``redis://`` URLs.)
"""

from __future__ import annotations

from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.exceptions import ReadOnlyError, ResponseError
from redis.retry import Retry


class PrimaryMoved(redis.exceptions.ConnectionError):
    """The server this connection reached is a replica now; the command was not run."""


def retry_once_moved() -> Retry:
    """A connection retry for clients that retry nothing else: a command refused because the
    primary moved ran nowhere, so it is sent once more at once, on a new connection."""
    return Retry(NoBackoff(), 1, supported_errors=(PrimaryMoved,))


def _demoted(exc: ResponseError) -> bool:
    # A blocked BRPOP (a worker waiting for messages) is answered UNBLOCKED when its server is
    # made a replica: the same news as READONLY.
    return isinstance(exc, ReadOnlyError) or str(exc).startswith("UNBLOCKED")


class _DropOnReadOnly(redis.connection.AbstractConnection):
    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().read_response(*args, **kwargs)
        except ResponseError as exc:
            if not _demoted(exc):
                raise
            self.disconnect()  # type: ignore[no-untyped-call]
            where = self._host_error()  # type: ignore[no-untyped-call]
            raise PrimaryMoved(f"Redis at {where} is a read-only replica now (failed over): reconnecting") from exc


class FailoverConnection(_DropOnReadOnly, redis.Connection):
    pass


class FailoverSSLConnection(_DropOnReadOnly, redis.SSLConnection):
    pass


class FailoverUnixConnection(_DropOnReadOnly, redis.UnixDomainSocketConnection):
    pass


def connection_class(url: str) -> type[redis.connection.AbstractConnection]:
    """The failover-following connection class for a plain Redis URL's scheme."""
    scheme = url.partition("://")[0]
    if scheme == "rediss":
        return FailoverSSLConnection
    if scheme == "unix":
        return FailoverUnixConnection
    return FailoverConnection
