"""The step runner: claim an attempt, run its task in-process, record the outcome.

It never lets an exception escape (soft time limits and cancels included), so the group's chord
body always runs.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from billiard.common import terminate_handler_fired
from celery.exceptions import SoftTimeLimitExceeded
from sqlalchemy import update

from celeryapp.context import StepContext, running_step
from celeryapp.errors import StepCancelled
from celeryapp.execution.advancing import advance_group
from celeryapp.execution.heartbeat import StepWatch
from celeryapp.execution.step_events import step_result
from celeryapp.execution.step_policy import StepRules
from celeryapp.execution.steps import Claim, Recorded, claim_step, finish_step
from celeryapp.messaging import keys
from celeryapp.messaging.dispatch import apply_effects, drop_pickup
from celeryapp.messaging.redis_client import get_redis
from celeryapp.outcome import classify
from models import ActivityStatus, utcnow
from models.session import autocommit, connection
from models.tables import ACTIVITIES

if TYPE_CHECKING:
    from celeryapp.app import ChordbeatCelery

logger = logging.getLogger(__name__)

#: Characters of an error message kept on the activity.
ERROR_CHARS = 2000
#: Tries at recording an outcome before falling back to a bare update.
RECORD_TRIES = 3
#: Pauses after each failed claim (a database blip); then the attempt is left to recovery.
CLAIM_RETRY_DELAYS_S = (0.2, 0.5, 0)
#: A step with a timeout advances its run itself only with at least this long left before its
#: soft time limit: the limit's exception must not land while the next group is being sent.
ADVANCE_MARGIN_S = 5.0


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _storable(text: str | None) -> str | None:
    """Step code writes what it likes: keep at most ERROR_CHARS, with NUL (which PostgreSQL refuses
    in text) and lone surrogates (which no driver can encode) made visible instead."""
    if text is None:
        return None
    visible = text[: ERROR_CHARS * 2].replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
    return visible[:ERROR_CHARS]


Outcome = tuple[ActivityStatus, str | None, str | None]


def _timed_out(claim: Claim) -> Outcome:
    return ActivityStatus.FAILED_WITH_ERROR, f"timed out after {claim.spec.timeout_s:g}s", None


def _interrupted(claim: Claim, watch: StepWatch) -> Outcome:
    """The watch interrupted the step: its timeout passed, its execution was cancelled, or recovery
    gave the attempt up (its outcome is then fenced off and changes nothing)."""
    if watch.timed_out:
        return _timed_out(claim)
    if watch.fenced:
        return ActivityStatus.CANCELLED, "stopped: recovery gave this attempt up", None
    if watch.stopped is not None:
        return ActivityStatus.CANCELLED, watch.stopped, None
    return ActivityStatus.CANCELLED, "cancelled", None


def execute_step(app: ChordbeatCelery, claim: Claim, watch: StepWatch) -> Outcome:
    """Run the step's task; return (status, error, message).

    The task is checked against this worker's rules first: a plan stored before the policy
    tightened, or a step of a kind switched off since, fails instead of running.
    """
    refusal = StepRules(app.settings, app.tasks.__contains__).spec_refusal(claim.spec.kind, claim.spec.task)
    try:
        try:
            if refusal is not None:
                return ActivityStatus.FAILED_WITH_ERROR, f"refused on this worker: {refusal}", None
            if watch.stopped is not None:
                return ActivityStatus.CANCELLED, watch.stopped, None  # revoked before it started
            result = app.tasks[claim.spec.task](*claim.spec.args, **claim.spec.kwargs)
        finally:
            watch.disarm()
    except StepCancelled:
        return _interrupted(claim, watch)
    except SoftTimeLimitExceeded:
        return _timed_out(claim)
    except BaseException as exc:  # the step's own failure (SystemExit too), recorded as its outcome
        if terminate_handler_fired():
            # The pool process is being terminated (the worker shuts down): the step did not
            # fail, it was interrupted. Let the process go; recovery runs the attempt again.
            raise
        # Only a cancel is not the step's failure. Anything else escaping would kill the pool
        # process, and the message would come back for another try of a step that failed.
        logger.info("step %r of execution %s failed: %r", claim.spec.name, claim.execution_id, exc)
        return ActivityStatus.FAILED_WITH_ERROR, _error_text(exc), None
    status, message = classify(result)
    error = message if status.failed else None
    return status, error, None if status.failed else message


def _record(
    app: ChordbeatCelery, claim: Claim, status: ActivityStatus, error: str | None, message: str | None
) -> Recorded:
    url = app.settings.database_url
    error, message = _storable(error), _storable(message)
    for attempt in range(1, RECORD_TRIES + 1):
        try:
            with autocommit(url) as conn:
                return finish_step(conn, claim, status, now=utcnow(), error=error, message=message)
        except Exception:
            logger.exception(
                "recording outcome of %s attempt %s failed (try %s)", claim.spec.name, claim.attempt, attempt
            )
            time.sleep(0.2 * attempt)
    # SafeFail: never leave the activity in progress. A bare update in a fresh transaction; if even
    # that fails, heartbeat recovery will fail and re-queue the attempt.
    try:
        with connection(url) as conn:
            conn.execute(
                update(ACTIVITIES)
                .where(ACTIVITIES.c.id == claim.activity_id, ACTIVITIES.c.status == ActivityStatus.IN_PROGRESS)
                .values(
                    status=ActivityStatus.FAILED_WITH_ERROR,
                    completed_at=utcnow(),
                    error=f"outcome could not be recorded (was {status.value})",
                )
            )
    except Exception:
        logger.critical("activity %s is left in progress: database unreachable", claim.activity_id, exc_info=True)
    return Recorded(closed=False, last_of_group=False)


def _claim(app: ChordbeatCelery, worker_task_id: int, attempt: int, node: str) -> Claim | Exception | None:
    error: Exception | None = None
    for delay in CLAIM_RETRY_DELAYS_S:
        try:
            # A transaction even for PostgreSQL's single statement: the claim commits only once
            # its runner, alive, asks for it. Alone it would commit whenever the statement ran,
            # and a worker killed while it waited (a locked table, a stalled server) would leave
            # an attempt claimed that nothing runs: recovery would fail it and use up an attempt.
            with connection(app.settings.database_url) as conn:
                return claim_step(conn, worker_task_id, attempt, node=node, now=utcnow())
        except Exception as exc:
            error = exc
            logger.warning("claiming worker task %s attempt %s failed: %s", worker_task_id, attempt, exc)
            time.sleep(delay)
    assert error is not None
    return error


def run_step(app: ChordbeatCelery, worker_task_id: int, attempt: int, *, node: str) -> dict[str, Any]:
    settings = app.settings
    # The pickup lease was taken when the worker received the message (signals.py).
    claim = _claim(app, worker_task_id, attempt, node)
    if not isinstance(claim, Claim):
        # Nothing was claimed, so nothing runs here; the attempt is still queued in the database.
        # Without the pickup lease, recovery sends it again once the database answers.
        drop_pickup(app, worker_task_id, attempt)
        if claim is None:
            logger.info("worker task %s attempt %s is not runnable here (duplicate or fenced)", worker_task_id, attempt)
            return {"status": "skipped"}
        logger.error(
            "could not claim worker task %s attempt %s (%s); recovery sends it again", worker_task_id, attempt, claim
        )
        return {"status": "unclaimed"}
    context = StepContext(
        claim.execution_id,
        claim.schedule_name,
        claim.spec.name,
        claim.step_index,
        claim.attempt,
        claim.payload,
        claim.spec.timeout_s,
    )
    watch = StepWatch(
        get_redis(settings.broker_url),
        heartbeat_key=keys.heartbeat_key(worker_task_id, attempt),
        cancel_key=keys.cancel_key(claim.execution_id),
        fenced_key=keys.fenced_key(worker_task_id, attempt),
        stop_key=keys.stop_key(worker_task_id, attempt),
        ttl_s=settings.heartbeat_ttl_s,
        timeout_s=claim.spec.timeout_s,
        done_keys=(keys.pickup_key(worker_task_id, attempt),),
    )
    started = time.monotonic()
    try:
        with running_step(context), watch:
            status, error, message = execute_step(app, claim, watch)
    except StepCancelled:
        # Landed between the step's return and the watch's stop.
        status, error, message = _interrupted(claim, watch)
    recorded = _record(app, claim, status, error, message)
    timeout_s = claim.spec.timeout_s
    if recorded.last_of_group and (not timeout_s or time.monotonic() - started < timeout_s - ADVANCE_MARGIN_S):
        _advance_now(app, claim)
    return step_result(status, error, message) if recorded.closed else {"status": "fenced"}


def _advance_now(app: ChordbeatCelery, claim: Claim) -> None:
    """The group's last attempt has ended: advance its run now, in this process, instead of after
    the chord's body went round (the group's count in Redis, a message, a free pool process: about
    2 ms, half of a group-to-group hop). The body still runs; the run being past the group by then,
    its compare-and-set changes nothing. It is also the backstop: should this fail, or two last
    attempts end at once and each count the other, the body advances the run as before."""
    try:
        effects = advance_group(app.settings.database_url, claim.execution_id, claim.step_index, now=utcnow())
        apply_effects(app, effects)
    except Exception:
        logger.warning(
            "execution %s group %s: not advanced at once; its chord's body will",
            claim.execution_id,
            claim.step_index,
            exc_info=True,
        )
