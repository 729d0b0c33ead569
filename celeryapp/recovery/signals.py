"""Worker wiring: startup recovery of this node's orphaned steps, the liveness file and the registry of
what it can run, the first reading of the reference clock."""

from __future__ import annotations

import gc
import logging
from typing import Any

import redis
from celery import bootsteps
from celery.concurrency import get_implementation
from celery.concurrency.prefork import TaskPool
from celery.signals import task_received, worker_init, worker_ready, worker_shutdown

from celeryapp.clock import clock
from celeryapp.messaging.redis_client import get_redis
from celeryapp.monitoring import worker_registry
from celeryapp.monitoring.health import remove, touch
from celeryapp.recovery.node_start import recover_node_in_background
from celeryapp.runtime import Runtime
from celeryapp.worker.dispatch import RUN_STEP, take_message

logger = logging.getLogger(__name__)

#: Seconds between two touches of the worker's liveness file (stale after 60 s).
HEALTH_INTERVAL_S = 10.0


class HealthStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """Touches the liveness file from the consumer's event loop: a hung loop goes stale."""

    requires = {"celery.worker.consumer.tasks:Tasks"}

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._timer: Any = None

    def start(self, parent: Any) -> None:
        alive(parent)
        self._timer = parent.timer.call_repeatedly(HEALTH_INTERVAL_S, alive, (parent,), priority=10)

    def stop(self, parent: Any) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def alive(consumer: Any) -> None:
    """Touch the liveness file and refresh what this worker can run in the registry, so that
    definitions are checked against it (see worker_registry)."""
    app: Runtime = consumer.app
    settings = app.settings
    touch(settings, "worker")
    try:
        queues = [queue.name for queue in consumer.task_consumer.queues]
        client = get_redis(settings.broker_url)
        worker_registry.publish(
            client, consumer.hostname, queues, app.tasks, settings, ttl_s=worker_registry.REGISTRY_TTL_S
        )
    except redis.RedisError as exc:
        # The broker is the same Redis: the worker is reconnecting; the next refresh publishes.
        logger.warning("this worker's tasks were not published (%s); retried in %g s", exc, HEALTH_INTERVAL_S)


@worker_ready.connect
def recover_own_steps(sender: Any = None, **_: Any) -> None:
    """A starting node runs nothing yet: steps recorded as processing on it are orphans, unless
    their heartbeat shows another live worker under the same name (see node_start)."""
    app: Runtime = sender.app
    node = sender.hostname
    try:
        recover_node_in_background(app, node)
    except Exception:
        # Signal receivers' errors are swallowed by Celery; say it loudly.
        logger.exception("startup recovery of %s failed; the periodic recovery will handle its steps", node)


@task_received.connect
def take_step_message(sender: Any = None, request: Any = None, **_: Any) -> None:
    """A step message reached this worker: from now on, its loss shows within a heartbeat's TTL."""
    # ``type``, not ``name``: a step's name is its readable shadow name (``<schedule>/<step>``).
    if request is None or request.type != RUN_STEP:
        return
    try:
        worker_task_id, attempt, *token = request.args  # no token: sent before runs had one
        take_message(request.task.app, int(worker_task_id), int(attempt), int(token[0]) if token else 0)
    except Exception:
        logger.exception("could not record the pickup of %s", request.id)


@worker_shutdown.connect
def forget_liveness(sender: Any = None, **_: Any) -> None:
    """A clean stop is not a live worker: ``chordbeat health worker`` says so at once, not 60 s later."""
    if sender is not None:
        app: Runtime = sender.app
        remove(app.settings, "worker")
        try:
            worker_registry.forget(get_redis(app.settings.broker_url), sender.hostname)
        except redis.RedisError as exc:
            logger.warning("this worker's registry entry was left to expire (%s)", exc)


@worker_init.connect
def read_reference_clock(sender: Any = None, **_: Any) -> None:
    """Read the reference clock before the pool forks: the children inherit the reading instead
    of each taking its own first one inside its first step's claim."""
    clock.measure()


@worker_init.connect
def freeze_before_fork(sender: Any = None, **_: Any) -> None:
    """Prefork: everything loaded so far is shared with the pool processes forked next. Keep the
    garbage collector off those objects, so that a collection in a child does not copy their pages
    (the memory saved: docs/performance.md). Other pools fork nothing."""
    pool = get_implementation(getattr(sender, "pool_cls", None) or "prefork")
    if isinstance(pool, type) and issubclass(pool, TaskPool):
        gc.freeze()
