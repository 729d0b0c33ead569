"""A starting worker's recovery of the steps left processing under its node name, by their heartbeats.

A worker starting as node N runs nothing yet, so the attempts the database records as processing
on N were its previous incarnation's: orphans, re-queued without waiting for the periodic recovery.
Unless a second worker was given the name of a live one (``celery worker -n``): the name alone
cannot tell the two apart, and re-queueing the live worker's steps would stop and run them again.
The heartbeats can: a live step's is refreshed every third of its lease, an orphan's expires within
a TTL. So an attempt is re-queued at once only if its heartbeat is gone and its claim is older than
a TTL (a step writes its first heartbeat just after its claim commits); the others are watched for
up to two TTLs by a thread of the starting worker. A heartbeat seen refreshed (or appearing) belongs
to a live worker: its attempt is left alone and the name's reuse is logged as an error. One seen
expiring is an orphan's: re-queued then, seconds after the start instead of a recovery pass later.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import select

from celeryapp.messaging import keys
from celeryapp.messaging.redis_client import get_redis
from celeryapp.recovery.recovery import RecoveryReport, requeue_lost
from celeryapp.runtime import Runtime
from models import ScheduleExecution, WorkerTask, WorkerTaskStatus, transaction, utcnow

logger = logging.getLogger(__name__)

#: Seconds between two checks of the watched heartbeats (a refresh comes every third of a lease).
CHECK_INTERVAL_S = 0.25
#: How long the watch lasts, in heartbeat TTLs: by then every heartbeat was refreshed or expired.
WATCH_TTLS = 2
#: What Redis's PTTL answers for a key that does not exist, and for one without a TTL.
_MISSING, _NO_TTL = -2, -1


@dataclass
class Watched:
    """A processing attempt of the node, and its heartbeat as last checked."""

    worker_task_id: int
    attempt: int
    token: int
    execution_id: int
    step_name: str
    claimed_at: datetime | None
    #: The heartbeat's remaining TTL (ms) at the last check; ``None`` while it was never seen.
    ttl_ms: int | None = None


@dataclass
class NodeStart:
    """Startup recovery of node ``node``: :meth:`check_heartbeats` once at start, then :meth:`watch` in a thread."""

    app: Runtime
    node: str
    report: RecoveryReport = field(default_factory=RecoveryReport)
    pending: list[Watched] = field(default_factory=list)
    #: The live worker sharing the name was reported (once per start).
    duplicate: bool = False
    #: Heartbeats were checked before: one seen for the first time now was written since.
    _checked_before: bool = False

    def load(self) -> NodeStart:
        query = (
            select(
                WorkerTask.id,
                WorkerTask.attempt,
                ScheduleExecution.token,
                WorkerTask.execution_id,
                WorkerTask.step_name,
                WorkerTask.started_at,
            )
            .join(ScheduleExecution, ScheduleExecution.id == WorkerTask.execution_id)
            .where(WorkerTask.status == WorkerTaskStatus.PROCESSING, WorkerTask.node == self.node)
        )
        with transaction(self.app.settings.database_url, read_only=True) as session:
            self.pending = [Watched(*row) for row in session.execute(query.order_by(WorkerTask.id))]
        return self

    def check_heartbeats(self, now: datetime | None = None) -> bool:
        """Read the pending attempts' heartbeats once, re-queue the orphans found, drop the attempts
        of a live worker. Whether any attempt is still to be watched."""
        if not self.pending:
            return False
        now = now or utcnow()
        ttl_s = self.app.settings.heartbeat_ttl_s
        client = get_redis(self.app.settings.broker_url)
        with client.pipeline(transaction=False) as pipe:
            for watched in self.pending:
                pipe.pttl(keys.heartbeat_key(watched.worker_task_id, watched.attempt, watched.token))
            ttls = [int(t) for t in pipe.execute()]
        still: list[Watched] = []
        for watched, ttl_ms in zip(self.pending, ttls, strict=True):
            if ttl_ms == _MISSING:
                expired = watched.ttl_ms is not None
                unclaimed_long = watched.claimed_at is None or watched.claimed_at < now - timedelta(seconds=ttl_s)
                if expired or unclaimed_long:
                    requeue_lost(
                        self.app,
                        watched.worker_task_id,
                        watched.attempt,
                        watched.token,
                        f"worker lost: {self.node} restarted",
                        now,
                        self.report,
                    )
                else:
                    still.append(watched)
            elif ttl_ms == _NO_TTL or _refreshed(watched.ttl_ms, ttl_ms, checked_before=self._checked_before):
                self._live(watched)
            else:
                watched.ttl_ms = ttl_ms
                still.append(watched)
        self.pending, self._checked_before = still, True
        return bool(still)

    def _live(self, watched: Watched) -> None:
        if not self.duplicate:
            self.duplicate = True
            logger.error(
                "node name %s is also the name of another live worker: step %r of execution %s (worker task %s) "
                "runs there and its heartbeat is refreshed, so it is left alone. Give every worker a name of its "
                "own (celery worker -n NAME@%%h); while two share one, a restart of either waits for heartbeats "
                "to expire before re-running the other's steps",
                self.node,
                watched.step_name,
                watched.execution_id,
                watched.worker_task_id,
            )
        else:
            logger.info("worker task %s on %s is another live worker's; left alone", watched.worker_task_id, self.node)

    def watch(self) -> None:
        """Check until every pending heartbeat was refreshed or expired (at most :data:`WATCH_TTLS`)."""
        deadline = time.monotonic() + WATCH_TTLS * self.app.settings.heartbeat_ttl_s
        try:
            while time.monotonic() < deadline:
                time.sleep(CHECK_INTERVAL_S)
                if not self.check_heartbeats():
                    break
        except Exception:
            # A thread's error would only reach stderr; the periodic recovery still covers the steps.
            logger.exception("startup recovery of %s stopped; the periodic recovery handles its steps", self.node)
            return
        if self.pending:
            logger.warning(
                "startup recovery of %s: %s steps neither refreshed nor expired; left to the periodic recovery",
                self.node,
                len(self.pending),
            )


def _refreshed(before_ms: int | None, now_ms: int, *, checked_before: bool) -> bool:
    """Whether a heartbeat was written since the last check: its TTL went up, or it appeared."""
    return now_ms > before_ms if before_ms is not None else checked_before


def recover_node(app: Runtime, node: str) -> NodeStart:
    """At worker start: re-queue the node's orphans whose heartbeat is gone; what remains to watch
    is in the answer's ``pending`` (see :meth:`NodeStart.watch`)."""
    start = NodeStart(app, node).load()
    start.check_heartbeats()
    if start.report.requeued:
        logger.warning("worker %s started: re-queued %s orphaned steps", node, len(start.report.requeued))
    return start


def recover_node_in_background(app: Runtime, node: str) -> None:
    """:func:`recover_node`, then its watch in a daemon thread (the worker starts consuming meanwhile)."""
    start = recover_node(app, node)
    if start.pending:
        threading.Thread(target=start.watch, name=f"chordbeat-node-start-{node}", daemon=True).start()
