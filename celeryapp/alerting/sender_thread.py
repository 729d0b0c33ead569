"""The alert sender's thread in control workers, and the Redis lease that lets one of them poll.

Only a worker consuming the control queue starts it, in its main process: never a step worker,
and never a step's child process, so the channels' secrets are never in a process running step
code. Of those workers, the one holding the lease polls the outbox every
``CHORDBEAT_ALERT_POLL_INTERVAL`` and runs the deadline watch every ``CHORDBEAT_ALERT_WATCH_INTERVAL``;
the others wait to take over when its lease lapses (a worker killed, or cut off from Redis).
While Redis cannot be asked at all, each of them watches and sends (see :meth:`SenderThread.may_send`).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import redis
from celery import bootsteps

from celeryapp.alerting import deadline_watch
from celeryapp.alerting.log_masking import masked_logger
from celeryapp.alerting.sender import Sender
from celeryapp.clock import clock
from celeryapp.config import Settings
from celeryapp.domain.names import CONTROL_QUEUE, PREFIX
from celeryapp.messaging.redis_client import get_redis, registered_script
from celeryapp.runtime import Runtime

logger = masked_logger(__name__)

#: The Redis key whose value names the worker sending alerts.
LEASE_KEY = f"{PREFIX}:alerts:sender"
#: Seconds the lease lasts unless renewed: a killed sender's successor waits at most this long.
LEASE_S = 15.0
#: Seconds a stopping worker waits for sends under way (each ends within its own timeout).
STOP_WAIT_S = 15.0
#: A held lease's TTL is at most the TTL this node gives; one longer than this many times that
#: was set by no sender (a hand-made key, say): taken over (room left for nodes polling slower).
LONGEST_TTL_FACTOR = 4
#: Renew the lease if this node holds it, take it if free, and take over one no sender could
#: hold: without expiry (one ``SET`` by hand stopped alerting for ever), with a TTL no sender
#: gives, holding no worker's name, or not a string at all. Answers {outcome, the value found,
#: its TTL in ms, its type}: outcome 1 renewed, 2 taken, 3 taken over, 0 another node's.
_TAKE_OR_RENEW = """
local kind = redis.call('TYPE', KEYS[1]).ok
if kind == 'none' then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    return {2, '', -2, kind}
end
if kind ~= 'string' then
    redis.call('DEL', KEYS[1])
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    return {3, '', -2, kind}
end
local value = redis.call('GET', KEYS[1])
local ttl = redis.call('PTTL', KEYS[1])
if value == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {1, '', ttl, kind}
end
local named = #value <= 255 and string.find(value, '^[^@%s%c]+@[^@%s%c]+$') ~= nil
if ttl < 0 or ttl > tonumber(ARGV[3]) or not named then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    return {3, value, ttl, kind}
end
return {0, '', ttl, kind}
"""
#: Characters of a lease's value quoted in the log when it is taken over.
QUOTED_VALUE_CHARS = 100
#: Give the lease up if this node holds it.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""


class SenderThread:
    """Polls the outbox while this node holds the sender's lease."""

    def __init__(self, settings: Settings, node: str) -> None:
        self.settings = settings
        self.node = node
        self.stopping = threading.Event()
        self.sender = Sender(settings)
        self.thread = threading.Thread(target=self._run, name="chordbeat-alert-sender", daemon=True)
        self._next_watch = 0.0
        self._without_lease = False

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=STOP_WAIT_S)
        self.sender.close(STOP_WAIT_S)
        try:
            client = get_redis(self.settings.broker_url)
            registered_script(client, _RELEASE)(keys=[LEASE_KEY], args=[self.node])
        except redis.RedisError as exc:
            logger.warning("the alert sender's lease was left to expire (%s)", exc)

    def _run(self) -> None:
        interval_s = self.settings.alert_poll_interval_s
        failing = False
        while not self.stopping.is_set():
            try:
                if self.may_send():
                    self._watch()
                    self.sender.poll()
            except Exception:
                # The database or Redis away: said once per outage (not every second), and the
                # next round tries again.
                if not failing:
                    logger.exception("the alert sender's round failed; retried every %g s", interval_s)
                failing = True
            else:
                if failing:
                    logger.warning("the alert sender's rounds work again")
                failing = False
            self.stopping.wait(interval_s)

    def may_send(self) -> bool:
        """Whether this node sends now: it holds the lease, or Redis cannot be asked. Nobody can
        hold the lease while Redis is away, and that is when the deadline watch matters most
        (beat and the steps stand still): every control worker then watches and sends, and the
        outbox's unique keys and the deliveries' claims still make each alert, and each send of
        it, one."""
        try:
            held = self.holds_lease()
        except redis.RedisError as exc:
            if not self._without_lease:
                logger.warning("Redis cannot be asked for the alert sender's lease (%s): sending without it", exc)
            self._without_lease = True
            return True
        if self._without_lease:
            logger.warning("Redis answers again: alerts are sent by the lease's holder")
        self._without_lease = False
        return held

    def holds_lease(self) -> bool:
        """Take the lease if free, renew it if ours, take it over if no sender could hold it (said
        in the log: someone or something wrote the key); whether this node now holds it. The
        lease always expires: a node that stops renewing it loses it."""
        client = get_redis(self.settings.broker_url)
        ttl_ms = int((LEASE_S + self.settings.alert_poll_interval_s) * 1000)
        script = registered_script(client, _TAKE_OR_RENEW)
        outcome, value, found_ttl_ms, kind = script(
            keys=[LEASE_KEY], args=[self.node, ttl_ms, LONGEST_TTL_FACTOR * ttl_ms]
        )
        if outcome == 2:
            logger.info("%s sends the alerts", self.node)
        elif outcome == 3:
            logger.warning(
                "the alert sender's lease %s was held by %s with %s: no sender could hold it; "
                "%s takes it over and sends the alerts",
                LEASE_KEY,
                _quoted(value),
                _unholdable(value, int(found_ttl_ms), _text(kind), LONGEST_TTL_FACTOR * ttl_ms),
                self.node,
            )
        return int(outcome) in {1, 2, 3}

    def _watch(self) -> None:
        if time.monotonic() < self._next_watch:
            return
        self._next_watch = time.monotonic() + self.settings.alert_watch_interval_s
        try:
            # Through the module: the watch is the deadlines' part, replaced as it grows.
            raised = deadline_watch.watch(
                self.settings.database_url,
                clock.now(),
                missed_grace_s=self.settings.alert_missed_grace_s,
                calendars_dir=self.settings.calendars_dir,
            )
        except Exception:
            logger.exception("the deadline watch failed; tried again in %g s", self.settings.alert_watch_interval_s)
            return
        if raised:
            logger.info("the deadline watch raised %d alerts", raised)


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _quoted(value: bytes | str) -> str:
    return repr(_text(value)[:QUOTED_VALUE_CHARS])


def _unholdable(value: bytes | str, ttl_ms: int, kind: str, longest_ms: int) -> str:
    """Why no sender could hold a lease like this one."""
    if kind != "string":
        return f"a Redis {kind}, not a string"
    if ttl_ms < 0:
        return "no expiry"
    if ttl_ms > longest_ms:
        return f"a TTL of {ttl_ms / 1000:.0f} s"
    return "not a worker's name"


class AlertSenderStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """Starts the sender in a worker consuming the control queue; stops it at the worker's shutdown
    only: a consumer restarting after a lost broker connection keeps its sender (and its lease,
    if Redis is back within :data:`LEASE_S`)."""

    requires = {"celery.worker.consumer.tasks:Tasks"}

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.sender: SenderThread | None = None

    def start(self, parent: Any) -> None:
        if self.sender is not None:
            return
        queues = {queue.name for queue in parent.task_consumer.queues}
        if CONTROL_QUEUE not in queues:
            return  # a step worker: step code runs here, channel secrets do not
        app: Runtime = parent.app
        self.sender = SenderThread(app.settings, parent.hostname)
        self.sender.start()

    def stop(self, parent: Any) -> None:
        pass

    def shutdown(self, parent: Any) -> None:
        if self.sender is not None:
            self.sender.stop()
            self.sender = None
