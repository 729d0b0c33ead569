"""The broker connection: kombu's Redis transport, made to ride out a Redis outage.

Two things in kombu 5.7 stop a worker from surviving a Redis restart with an outage:

* When the consumer loses its connection, Celery first ``collect()``s it, which detaches the
  transport (``transport.client = None``) but leaves the default channel open when closing it
  failed mid-way (Redis is down). The following ``close()`` closes that channel again; its
  ``restore_unacked`` needs a fresh connection pool, builds it from ``transport.client`` and
  raises ``AttributeError: 'NoneType' object has no attribute 'hostname'``. That is not a
  connection error, so it escapes ``ignore_errors`` and the worker exits with "Unrecoverable
  error". Our channel reports a detached transport as what it is, a lost connection, which the
  consumer ignores while it reconnects. (The unacked messages it could not restore stay in
  Redis; chordbeat's recovery re-sends their steps long before kombu's visibility timeout.)
* Reconnection backs off to 30 s between tries, so after a 60 s outage a worker may idle for
  another 16 s. Ours backs off to :data:`RECONNECT_INTERVAL_MAX_S`.

A ``sentinel://`` list selects kombu's Sentinel transport (with the same two fixes), whose
connections ask the Sentinels again when the primary fails over; a plain URL's connections drop
themselves on ``READONLY`` (:mod:`celeryapp.messaging.failover`), so a failover behind a DNS name or
a virtual IP is ridden out the same way.

Both channels refuse a message whose envelope cannot be decoded or nests too deep
(:class:`~celeryapp.messaging.serialization.RefusingEnvelopes`): kombu's read raised in the event
loop and the worker exited.
"""

from __future__ import annotations

from typing import Any

import redis
from celery.app.amqp import AMQP
from kombu.connection import Connection
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.json import dumps

from celeryapp.clock import clock
from celeryapp.messaging.failover import FailoverConnection, FailoverSSLConnection, retry_once_moved
from celeryapp.messaging.redis_client import registered_script, sentinel_options
from celeryapp.messaging.serialization import RefusingEnvelopes
from celeryapp.redis_urls import is_sentinel

#: Longest pause between two reconnection attempts of a worker's or beat's broker connection.
RECONNECT_INTERVAL_MAX_S = 2.0


#: kombu's record of a message taken (KEYS: unacked index, unacked; ARGV: time, tag, entry), and
#: of one acknowledged (ARGV: tag): its two writes as one script, atomic as kombu's MULTI/EXEC,
#: one command and one reply instead of four each (docs/performance.md: what a step costs).
_TAKEN_LUA = "redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2]) redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])"
_ACKED_LUA = "redis.call('ZREM', KEYS[1], ARGV[1]) redis.call('HDEL', KEYS[2], ARGV[1])"


class ReferenceClockQoS(kombu_redis.QoS):  # type: ignore[misc]
    """kombu's record of the messages a consumer took and has not acknowledged, with the time each
    was taken by the reference clock, not by this host's: recovery compares it with its own
    reference time (:func:`celeryapp.messaging.unacked.taken_before`), and a host clock 2 minutes
    ahead made a dead worker's message wait 2 minutes longer to be sent again."""

    def append(self, message: Any, delivery_tag: str) -> None:
        delivery = message.delivery_info
        entry = dumps([message._raw, delivery["exchange"], delivery["routing_key"]])  # type: ignore[no-untyped-call]
        with self.channel.conn_or_acquire() as client:
            recorded = [clock.timestamp(), delivery_tag, entry]
            registered_script(client, _TAKEN_LUA)(keys=[self.unacked_index_key, self.unacked_key], args=recorded)
        virtual.QoS.append(self, message, delivery_tag)  # type: ignore[no-untyped-call]

    def ack(self, delivery_tag: str) -> None:
        self._forget(delivery_tag)
        virtual.QoS.ack(self, delivery_tag)  # type: ignore[no-untyped-call]

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        if requeue:  # kombu's: putting the message back removes its record too
            super().reject(delivery_tag, requeue=True)  # type: ignore[no-untyped-call]
            return
        self._forget(delivery_tag)
        virtual.QoS.ack(self, delivery_tag)  # type: ignore[no-untyped-call]

    def _forget(self, delivery_tag: str) -> None:
        with self.channel.conn_or_acquire() as client:
            registered_script(client, _ACKED_LUA)(keys=[self.unacked_index_key, self.unacked_key], args=[delivery_tag])


class _DetachedIsLost(RefusingEnvelopes, kombu_redis.Channel):  # type: ignore[misc]
    QoS = ReferenceClockQoS
    from_transport_options = (*kombu_redis.Channel.from_transport_options, "max_message_bytes")  # type: ignore[assignment]
    _pooled_client: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        # kombu builds a new client on the channel's pool for every publish, acknowledgement and
        # unacknowledged-message record (docs/performance.md: several a step, each costly); a client
        # holds no connection of its own (each command takes one from the pool): one per pool serves.
        if asynchronous:
            return super()._create_client(asynchronous=True)  # type: ignore[no-untyped-call]
        pool = self.pool
        client = self._pooled_client
        if client is None or client.connection_pool is not pool:
            client = self._pooled_client = super()._create_client()  # type: ignore[no-untyped-call]
        return client

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        if self.connection is None or self.connection.client is None:
            raise redis.exceptions.ConnectionError("the broker connection was closed")
        return super()._connparams(asynchronous=asynchronous)  # type: ignore[no-any-return,no-untyped-call]


class FailoverChannel(_DetachedIsLost):
    """kombu's Redis channel on connections that follow a failover behind a name, with our fix."""

    connection_class = FailoverConnection
    connection_class_ssl = FailoverSSLConnection

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        # An ack refused by a demoted primary is sent again to the new one at once; left to the
        # consumer's reconnection, the message would be redelivered.
        return {**super()._connparams(asynchronous=asynchronous), "retry": retry_once_moved()}

    @property
    def supports_batch_publish(self) -> bool:
        """Whether ``Producer.batch()`` may send many messages in one pipeline (a fire batch's first
        groups: docs/scaling.md). kombu refuses it on connections that retry, since a pipeline sent
        again might run twice; ours retries only what a demoted primary refused, which ran nowhere."""
        options = dict(self.pool.connection_kwargs)
        if options.get("retry") == retry_once_moved():
            del options["retry"]
        return not self.retry_on_timeout and kombu_redis._batch_publish_retry_safe(options)  # type: ignore[no-any-return,no-untyped-call]


class SentinelChannel(_DetachedIsLost, kombu_redis.SentinelChannel):  # type: ignore[misc]
    """kombu's Sentinel channel (its connections already follow the primary), with our fix."""

    from_transport_options = (*kombu_redis.SentinelChannel.from_transport_options, "max_message_bytes")  # type: ignore[assignment]


class Transport(kombu_redis.Transport):  # type: ignore[misc]
    Channel = FailoverChannel


class SentinelTransport(kombu_redis.SentinelTransport):  # type: ignore[misc]
    Channel = SentinelChannel


class ReconnectingConnection(Connection):  # type: ignore[misc]
    """A broker connection that retries forever, at most a couple of seconds apart."""

    def _ensure_connection(
        self,
        errback: Any = None,
        max_retries: int | None = None,
        interval_start: float = 0.5,
        interval_step: float = 0.5,
        interval_max: float = RECONNECT_INTERVAL_MAX_S,
        callback: Any = None,
        reraise_as_library_errors: bool = True,
        timeout: float | None = None,
    ) -> Any:
        return super()._ensure_connection(  # type: ignore[no-untyped-call]
            errback,
            max_retries,
            interval_start,
            interval_step,
            min(interval_max, RECONNECT_INTERVAL_MAX_S),
            callback,
            reraise_as_library_errors,
            timeout,
        )

    def maybe_switch_next(self) -> None:
        # kombu would move on to the list's next URL, taking kombu's own transport from its scheme
        # and the password from that entry (none). Our lists are Sentinel lists, each of whose
        # connections asks every Sentinel in turn: there is nothing to switch to.
        pass

    def as_uri(self, *args: Any, **kwargs: Any) -> str:
        # Logs name the broker by its URL scheme, not by the transport class path.
        uri: str = super().as_uri(*args, **kwargs)
        uri = uri.replace(f"{SENTINEL_TRANSPORT}://", "sentinel://", 1)
        return uri.replace(f"{TRANSPORT}://", "rediss://" if self.ssl else "redis://", 1)


class ChordbeatAMQP(AMQP):  # type: ignore[misc]
    Connection = ReconnectingConnection


#: ``broker_transport`` value selecting :class:`Transport` (the URL keeps its redis:// scheme).
TRANSPORT = f"{__name__}:Transport"
#: ``broker_transport`` value selecting :class:`SentinelTransport` for a ``sentinel://`` list.
SENTINEL_TRANSPORT = f"{__name__}:SentinelTransport"


def transport_for(url: str) -> str:
    """The ``broker_transport`` for a broker URL."""
    return SENTINEL_TRANSPORT if is_sentinel(url) else TRANSPORT


def sentinel_transport_options(url: str, master: str) -> dict[str, Any]:
    """What kombu's Sentinel transport and Celery's Sentinel result backend need besides a
    ``sentinel://`` list (nothing for a plain URL)."""
    if not is_sentinel(url):
        return {}
    return {"master_name": master, "sentinel_kwargs": sentinel_options()}
