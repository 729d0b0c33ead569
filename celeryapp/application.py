"""The Celery application: configuration from :class:`Settings`, queues and routes."""

from __future__ import annotations

import ssl
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs, urlsplit

from celery import Celery
from kombu.entity import Queue
from sqlalchemy import event
from sqlalchemy.orm import Session

from celeryapp.alerting import child_environment
from celeryapp.alerting.channels import channel_names
from celeryapp.alerting.sender_thread import AlertSenderStep
from celeryapp.clock import clock
from celeryapp.config import Settings
from celeryapp.domain.names import CONTROL_QUEUE, PUBLIC_QUEUE, STEPS_QUEUE
from celeryapp.domain.redaction import credentials_apart
from celeryapp.execution.limit_files import apply_file_limits
from celeryapp.messaging import redis_client, reference_time, serialization
from celeryapp.messaging.broker import sentinel_transport_options, transport_for
from celeryapp.messaging.refused_bodies import AnswerRefusedBodies
from celeryapp.recovery.signals import HealthStep
from celeryapp.redis_urls import is_sentinel, parse_sentinels
from celeryapp.runtime import Runtime
from celeryapp.variables import VISIBILITY_TIMEOUT_S
from celeryapp.worker.dispatch import apply_effects

#: Modules holding chordbeat's own tasks; a worker imports them at start.
TASK_MODULES = ("tasks.steps", "tasks.control", "tasks.service", "tasks.builtin", "tasks.examples")

#: Beat sleeps at most this long between ticks, so new and changed entries are seen quickly.
BEAT_MAX_LOOP_INTERVAL_S = 5
#: RedBeat lock lifetime: a SIGKILLed beat is replaced within lock + loop interval (35 s).
REDBEAT_LOCK_TIMEOUT_S = 30
#: Seconds between two repairs of beat entries from the database.
RECONCILE_INTERVAL_S = 60.0
#: A chord's counting keys live this long if the chord never completes: longer than a group runs.
CHORD_EXPIRES_S = 24 * 3600
#: Seconds between two housekeeping passes.
HOUSEKEEPING_INTERVAL_S = 3600.0


class ChordbeatCelery(Celery):  # type: ignore[misc]
    """A Celery app that carries chordbeat's settings."""

    settings: Settings
    amqp_cls = "celeryapp.messaging.broker:ChordbeatAMQP"
    # redis:// result backends on connections that follow a failover (see results.py).
    loader_cls = "celeryapp.messaging.results:Loader"
    task_cls = "celeryapp.messaging.expiry:ReferenceClockTask"
    # Workers obey only inspection commands from the broker (see remote_control.py).
    control_cls = "celeryapp.messaging.remote_control:GuardedControl"

    def apply_settings(self, settings: Settings) -> None:
        self.settings = settings
        redis_client.use_sentinel_master(settings.sentinel_master)
        self.conf.update(celery_config(settings))
        reference_time.install(settings.broker_url)

    def now(self) -> datetime:
        """The reference clock's time (:mod:`celeryapp.clock`): beat's due times and fire slots, and
        the expiry of every message sent, are reckoned by it, never by this host's clock."""
        return clock.now()

    def alert_channels(self) -> frozenset[str] | None:
        """The channel names definitions may use: the ``CHORDBEAT_ALERT_CHANNELS`` file's, read at
        each call (an edited file counts at the next apply); ``None`` when the variable is not set.
        Given to the apply paths, which live below the alerting layer that reads the file."""
        if self.settings.alert_channels_file is None:
            return None
        return channel_names(self.settings)

    def apply_file_limits(
        self,
        session: Session,
        limits: Sequence[Mapping[str, Any]],
        *,
        source: str,
        dry_run: bool,
        remove: bool | Collection[str],
    ) -> dict[str, list[str]]:
        """A schedule file's limits, stored by the execution layer for the scheduling layer's apply
        (which may not import it: the two are parts of one layer). The steps a limit made larger
        admits are sent once the file's transaction commits (each attempt has a session of its own)."""
        changes, admitted = apply_file_limits(session, limits, source=source, dry_run=dry_run, remove=remove)
        if admitted.dispatch or admitted.limit_wakes:
            event.listen(session, "after_commit", lambda _: apply_effects(self, admitted), once=True)
        return changes

    @property
    def redbeat_redis(self) -> Any:
        """RedBeat's client (RedBeat takes it from here when there is one): chordbeat's own, which
        follows a failover (Sentinel or ``READONLY``) and keeps one pool a process; RedBeat's
        Sentinel client would build a new pool, and ask the Sentinels, at every call."""
        return redis_client.get_redis(self.settings.redbeat_url)


#: The layers below are handed the app as a :class:`Runtime`: mypy checks here that it is one.
_AS_RUNTIME: type[Runtime] = ChordbeatCelery


def _broker_ssl(url: str) -> dict[str, Any] | None:
    """Certificates are verified on ``rediss://`` unless the URL says otherwise.

    (kombu would default to no verification, and only for its own transport name.)
    """
    if not url.startswith("rediss://"):
        return None
    query = parse_qs(urlsplit(url).query)
    required = query.get("ssl_cert_reqs", ["required"])[0].lower()
    levels = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
    return {"ssl_cert_reqs": levels.get(required.removeprefix("cert_"), ssl.CERT_REQUIRED)}


def _redbeat_redis(settings: Settings) -> dict[str, Any]:
    # ``celery inspect conf`` and Flower show the settings, masking only what Celery knows by name:
    # RedBeat's URL goes without its password, which travels in the (masked) options.
    options: dict[str, Any] = {"socket_timeout": 30, "socket_connect_timeout": 5, "health_check_interval": 25}
    if not is_sentinel(settings.redbeat_url):
        url, credentials = credentials_apart(settings.redbeat_url)
        return {"redbeat_redis_url": url, "redbeat_redis_options": {**options, **credentials}}
    sentinels = parse_sentinels(settings.redbeat_url)
    given = {"username": sentinels.username, "password": sentinels.password}
    return {
        "redbeat_redis_url": sentinels.display("redis-sentinel"),
        "redbeat_redis_options": {
            **options,
            "sentinels": [list(address) for address in sentinels.addresses],
            "service_name": settings.sentinel_master,
            "db": sentinels.db,
            "sentinel_kwargs": redis_client.sentinel_options(),
            **{name: value for name, value in given.items() if value},
        },
    }


def celery_config(settings: Settings) -> dict[str, Any]:
    return {
        "broker_url": settings.broker_url,
        "result_backend": settings.result_backend,
        # Workers and beat ride out a Redis outage of any length: they never give up reconnecting,
        # and the transport survives losing its connection with messages in flight (see broker.py).
        "broker_transport": transport_for(settings.broker_url),
        "broker_use_ssl": _broker_ssl(settings.broker_url),
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,
        # JSON only: nothing on the broker can make a worker unpickle attacker-controlled bytes.
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "task_serializer": "json",
        "result_serializer": "json",
        "event_serializer": "json",
        # At-least-once delivery. A message is acked only after its task returns, a pool child that
        # dies mid-task gets its message put back at once, and a worker holds one message beyond
        # those it runs, so a crash strands as little as possible. Duplicates this can cause are
        # made harmless by the database: step runners claim their worker task with a
        # compare-and-set and advancement is guarded the same way.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "broker_transport_options": {
            "visibility_timeout": VISIBILITY_TIMEOUT_S,
            "socket_timeout": 30,
            "health_check_interval": 25,
            # Workers take from their queues in the order given (control first, then service
            # calls, then steps) and, within a queue, by message priority (0 first). Steps of later
            # groups get higher priority: runs already under way finish before new ones start,
            # so a next group never waits behind a backlog of other runs' first steps.
            "queue_order_strategy": "priority",
            "priority_steps": list(range(10)),
            "max_message_bytes": settings.max_message_bytes,
            **sentinel_transport_options(settings.broker_url, settings.sentinel_master),
        },
        "result_backend_transport_options": {
            "result_chord_ordered": True,
            **sentinel_transport_options(settings.result_backend, settings.sentinel_master),
        },
        # Only service calls store a result (their caller reads it at once); step runners, fires,
        # advancements and beat's messages store none. A chord's bookkeeping keys are deleted when
        # its body is sent; they expire only if the chord never completes (recovery advances it).
        "result_expires": int(settings.result_expires_s),
        "result_chord_expires": CHORD_EXPIRES_S,
        "task_default_queue": STEPS_QUEUE,
        # "celery" is where a plain ``send_task`` from another service lands (it knows no routes).
        "task_queues": tuple(Queue(name) for name in (CONTROL_QUEUE, PUBLIC_QUEUE, STEPS_QUEUE)),  # type: ignore[no-untyped-call]
        "task_routes": {"chordbeat.*": {"queue": CONTROL_QUEUE}, "chordbeat.run_step": {"queue": STEPS_QUEUE}},
        # Task events stay off unless someone watches: Flower switches them on in the workers
        # while it runs (enable_events). Publishing them costs ~15% of a worker's CPU per task.
        "worker_send_task_events": False,
        "timezone": "UTC",
        "enable_utc": True,
        "beat_scheduler": "celeryapp.scheduling.beat:ChordbeatScheduler",
        # Internal periodic tasks; every schedule of the database gets its own dynamic entry. Nobody
        # reads what beat's messages return: storing it would keep a result key a day per message.
        "beat_schedule": {
            "chordbeat-reconcile": {
                "task": "chordbeat.reconcile_beat",
                "schedule": RECONCILE_INTERVAL_S,
                "options": {"queue": CONTROL_QUEUE, "expires": RECONCILE_INTERVAL_S, "ignore_result": True},
            },
            "chordbeat-recover": {
                "task": "chordbeat.recover",
                "schedule": settings.recovery_interval_s,
                "options": {"queue": CONTROL_QUEUE, "expires": settings.recovery_interval_s, "ignore_result": True},
            },
            "chordbeat-housekeeping": {
                "task": "chordbeat.housekeeping",
                "schedule": HOUSEKEEPING_INTERVAL_S,
                "options": {"queue": CONTROL_QUEUE, "expires": HOUSEKEEPING_INTERVAL_S, "ignore_result": True},
            },
        },
        "beat_max_loop_interval": BEAT_MAX_LOOP_INTERVAL_S,
        **_redbeat_redis(settings),
        "redbeat_key_prefix": "chordbeat:redbeat:",
        "redbeat_lock_timeout": REDBEAT_LOCK_TIMEOUT_S,
        "imports": settings.task_modules,
    }


def _answer_refused(app: ChordbeatCelery) -> serialization.RefusalHook:
    def answer(task: str, task_id: str, error: Exception) -> None:
        registered = app.tasks.get(task)
        # Only service calls store a result, read by a caller waiting for it: nobody else is.
        if registered is not None and not registered.ignore_result:
            app.backend.mark_as_failure(task_id, error)

    return answer


def create_app(settings: Settings | None = None) -> ChordbeatCelery:
    app = ChordbeatCelery("chordbeat", include=list(TASK_MODULES), set_as_current=True)
    # Poisoned messages and results are refused at decoding instead of killing a worker; the
    # caller of a service call too long to decode is answered with the reason.
    serialization.install(_answer_refused(app))
    app.apply_settings(settings or Settings.from_env())
    app.steps["consumer"].add(HealthStep)
    app.steps["consumer"].add(AnswerRefusedBodies)
    app.steps["consumer"].add(AlertSenderStep)
    # The sender's variables stay in the main process: pool children running steps drop them.
    child_environment.connect()
    return app
