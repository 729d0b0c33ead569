"""Whether a missing heartbeat means a lost worker, or only that Redis changed under the heartbeats.

Recovery takes an attempt whose heartbeat key expired for one whose worker is gone. That holds
while the Redis answering is the one the heartbeats were written to, by its clock, and recovery
itself kept running. It does not hold for one heartbeat TTL after recovery could not run (the
keys expired meanwhile, or vanished with Redis's data), after Redis's clock jumped forward (every
key with less time to live than the jump expired at once), nor after the primary changed: Redis
keeps a key's expiry as an absolute time, a promoted replica inherits it and expires it by its
own clock.
"""

from __future__ import annotations

import logging

import redis
from sqlalchemy import select

from celeryapp.clock import clock
from celeryapp.domain.names import PREFIX
from celeryapp.messaging import keys
from celeryapp.messaging.redis_client import get_redis
from celeryapp.runtime import Runtime
from models import ScheduleExecution, WorkerTask, WorkerTaskStatus, transaction

logger = logging.getLogger(__name__)

#: Lives a little longer than two recovery intervals: missing, recovery has not run for a while.
RECOVERY_SEEN_KEY = f"{PREFIX}:recovery:seen"
#: While present, missing heartbeats are not yet taken for lost workers (see heartbeats_trusted).
HEARTBEAT_GRACE_KEY = f"{PREFIX}:recovery:heartbeat-grace"
#: The run id (``INFO server``) of the Redis server the last pass talked to. Replicated like any
#: key, so on a promoted replica (or a server restarted from its snapshot) it names another server.
PRIMARY_KEY = f"{PREFIX}:recovery:primary"


def heartbeats_trusted(app: Runtime) -> bool:
    """Whether a missing heartbeat now means a lost worker.

    Not for one TTL after recovery itself could not run (Redis was away, or beat was), nor after
    Redis's clock jumped forward: running steps' heartbeat keys expired meanwhile or vanished with
    Redis's data, and their watches need a moment to write them again. Re-queueing then would stop
    and re-run steps that are fine. Nor for one TTL after the Redis primary changed
    (:func:`primary_changed`).
    """
    settings = app.settings
    client = get_redis(settings.broker_url)
    gap_ms = int((2 * settings.recovery_interval_s + settings.heartbeat_ttl_s) * 1000)
    unseen = client.set(RECOVERY_SEEN_KEY, "1", px=gap_ms, get=True) is None
    if primary_changed(app, client) or unseen:
        client.set(HEARTBEAT_GRACE_KEY, "1", px=int(settings.heartbeat_ttl_s * 1000))
        return False
    # Redis's clock jumped forward: every heartbeat with less time to live than the jump expired at
    # once. Read now, so that a jump no process has seen yet is not taken for lost workers.
    clock.measure()
    if clock.jumped_forward_within(settings.heartbeat_ttl_s):
        return False
    return not client.exists(HEARTBEAT_GRACE_KEY)


def primary_changed(app: Runtime, client: redis.Redis) -> bool:
    """Whether the Redis server answering is another than the last pass's: a promoted replica, or a
    server restarted from its snapshot (``run_id`` is new at each start).

    Redis keeps a key's expiry as an absolute time and a replica inherits it, so the new server
    expires keys by its own clock: one ahead drops running steps' heartbeats at once, one behind
    keeps a dead worker's for as much longer. The first is covered by the grace heartbeats_trusted
    then gives; the second by shortening what is left of every live attempt's keys to one TTL.
    """
    run_id = client.info("server")["run_id"]
    previous = client.set(PRIMARY_KEY, run_id, get=True)
    # None: the first pass, or Redis lost its data (RECOVERY_SEEN_KEY is gone too, which is a gap).
    if previous is None or previous == run_id:
        return False
    logger.warning(
        "recovery: the Redis primary changed (run id %s, was %s): its clock may not be the old one's, "
        "so no step is taken for lost for one heartbeat TTL",
        run_id,
        previous,
    )
    _cap_inherited_expiries(app, client)
    return True


def _cap_inherited_expiries(app: Runtime, client: redis.Redis) -> None:
    """Leave each live attempt's heartbeat and pickup key at most one TTL to live on the new server's
    clock (``PEXPIRE … LT``: a key written since keeps its own): a key expiring later only because
    this clock is behind the old one would hide a dead worker for as much longer."""
    with transaction(app.settings.database_url, read_only=True) as session:
        attempts = session.execute(
            select(WorkerTask.id, WorkerTask.attempt, ScheduleExecution.token)
            .join(ScheduleExecution, ScheduleExecution.id == WorkerTask.execution_id)
            .where(WorkerTask.status.in_([WorkerTaskStatus.PROCESSING, WorkerTaskStatus.QUEUED]))
        ).all()
    ttl_ms = int(app.settings.heartbeat_ttl_s * 1000)
    with client.pipeline(transaction=False) as pipe:
        for task_id, attempt, token in attempts:
            pipe.pexpire(keys.heartbeat_key(task_id, attempt, token), ttl_ms, lt=True)
            pipe.pexpire(keys.pickup_key(task_id, attempt, token), ttl_ms, lt=True)
        pipe.execute()
