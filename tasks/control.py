"""Control tasks: advancement (every chord's body), firing schedules, repairing beat entries."""

from __future__ import annotations

import logging
from typing import Any

from celery import Task
from celery.signals import task_received, task_revoked

from celeryapp import app
from celeryapp.application import HOUSEKEEPING_INTERVAL_S
from celeryapp.domain.limits import check_int
from celeryapp.errors import ChordbeatError, InvalidArgument
from celeryapp.execution.advancing import advance_group
from celeryapp.messaging.redis_client import get_redis
from celeryapp.recovery import housekeeping as history_purge
from celeryapp.recovery import limit_waits, lost_slots, recovery
from celeryapp.scheduling import beat_entries, queued_fires
from celeryapp.worker import firing
from celeryapp.worker.dispatch import apply_effects
from models import utcnow

logger = logging.getLogger(__name__)


@app.task(name="chordbeat.advance_execution", acks_late=True, reject_on_worker_lost=True, throws=(ChordbeatError,))
def advance_execution(execution_id: int, step_index: int) -> None:
    check_int(execution_id, "execution_id", InvalidArgument)
    check_int(step_index, "step_index", InvalidArgument, low=0)
    # Usually the group's last step has advanced the run already: the body is the backstop.
    apply_effects(app, advance_group(app.settings.database_url, execution_id, step_index, now=utcnow()))


@app.task(name="chordbeat.fire_schedule", acks_late=True, reject_on_worker_lost=True, throws=(ChordbeatError,))
def fire_schedule(name: str, nominal_at: str | None = None, trigger: str | None = None) -> dict[str, Any]:
    """Sent by beat; ``nominal_at`` is the slot it fires (absent: now, e.g. a hand-made message)."""
    name, when, kind = firing.fire_arguments(name, nominal_at, trigger, now=utcnow())
    return firing.fire(app, name, nominal_at=when, trigger=kind)


@app.task(name="chordbeat.fire_batch", bind=True, acks_late=True, reject_on_worker_lost=True, throws=(ChordbeatError,))
def fire_batch(self: Task, fires: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Sent by beat: the slots one tick found due, each ``{"name", "nominal_at", "trigger"}``."""
    queued_fires.taken(get_redis(app.settings.broker_url), self.request.id)
    return firing.fire_batch(app, firing.batch_arguments(fires, now=utcnow()))


@task_received.connect
def fire_batch_received(sender: Any = None, request: Any = None, **_: Any) -> None:
    """A fire message a worker received is taken, whether or not it lives to run it: one that dies
    first (SIGKILLed) leaves the message unacked for the broker's visibility timeout (6 h), and its
    marker would hold the schedule's fires back until then (the task's body says so again)."""
    if request is not None and getattr(request, "type", None) == fire_batch.name:
        queued_fires.taken(get_redis(app.settings.broker_url), request.id)


@task_revoked.connect
def fire_batch_dropped(sender: Any = None, request: Any = None, **_: Any) -> None:
    """A fire message dropped unread (expired, revoked) is no longer queued either."""
    if getattr(sender, "name", None) == fire_batch.name and request is not None:
        queued_fires.taken(get_redis(app.settings.broker_url), request.id)


@app.task(name="chordbeat.reconcile_beat", send_events=False)  # periodic: kept out of Flower
def reconcile_beat() -> dict[str, list[str]]:
    """Periodic repair of RedBeat entries from the database (both ways), and lost slots re-fired.

    The two are independent: a failed repair must not also cost the runs of lost fires.
    """
    try:
        changes: beat_entries.EntryChanges | None = beat_entries.reconcile(app)
    except Exception:
        logger.exception("repairing beat entries failed; lost slots are still re-fired")
        changes = None
    refired = lost_slots.refire_lost_slots(app)
    if changes is None:
        return {"written": [], "removed": [], "refired": refired, "failed": ["reconcile"]}
    return {"written": changes.written, "removed": changes.removed, "refired": refired}


@app.task(name="chordbeat.recover", send_events=False)  # periodic: kept out of Flower
def recover() -> dict[str, Any]:
    """Periodic recovery: lost workers, lost messages, stuck executions, timeouts, and the slot
    record of paused schedules."""
    report = recovery.recover(app)
    return {
        "requeued": report.requeued,
        "resent": report.resent,
        "unstuck": report.unstuck,
        "timed_out": report.timed_out,
        "redis_reset": report.redis_reset,
        "paused_slots": report.paused_slots,
        "skipped": report.skipped,
    }


#: Limits one wake-up message may name (a pass names those it locked: a few).
MAX_WOKEN_LIMITS = 1000


@app.task(name="chordbeat.settle_limits", send_events=False)  # a timer's pass: kept out of Flower
def settle_limits(limit_ids: list[int]) -> int:
    """Sent with a countdown when a waiter of these limits gets its rate token back (or a pass
    could not lock them): whoever fits now is admitted. How many steps it admitted."""
    if not isinstance(limit_ids, list) or not 1 <= len(limit_ids) <= MAX_WOKEN_LIMITS:
        raise InvalidArgument("limit_ids", f"must be a list of 1 to {MAX_WOKEN_LIMITS} limit ids")
    for limit_id in limit_ids:
        check_int(limit_id, "limit_ids", InvalidArgument, low=1)
    return limit_waits.settle_due(app, limit_ids, now=utcnow())


@app.task(name="chordbeat.housekeeping", send_events=False)  # periodic: kept out of Flower
def housekeeping() -> dict[str, Any]:
    """Delete finished executions and slot records past the retention; a pass that ran out of
    time sends the next one, so a backlog is worked off in turns that leave the thread free."""
    report = history_purge.purge(app)
    if report.unfinished:
        housekeeping.apply_async(
            countdown=history_purge.FOLLOW_UP_DELAY_S, expires=HOUSEKEEPING_INTERVAL_S, ignore_result=True
        )
    return report.as_json()
