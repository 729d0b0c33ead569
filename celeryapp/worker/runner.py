"""The step runner: claim an attempt, run its task in-process, record the outcome.

It never lets an exception escape (soft time limits and cancels included), so the group's chord
body always runs.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import Any, NamedTuple

from billiard.common import terminate_handler_fired
from celery.exceptions import SoftTimeLimitExceeded

from celeryapp.context import StepContext, running_step
from celeryapp.domain.effects import Effects
from celeryapp.domain.limits import ERROR_CHARS, LOG_TAIL_CHARS, TRACEBACK_CHARS
from celeryapp.domain.redaction import hide_secrets
from celeryapp.domain.step_policy import StepRules
from celeryapp.errors import StepCancelled
from celeryapp.execution.advancing import advance_group
from celeryapp.execution.limit_steps import release_attempt
from celeryapp.execution.steps import (
    Claim,
    Recorded,
    claim_committed,
    claim_step,
    finish_step,
    release_claim,
    stored_outcome,
)
from celeryapp.messaging import keys
from celeryapp.messaging.redis_client import get_redis
from celeryapp.outcome import classify
from celeryapp.runtime import Runtime
from celeryapp.worker import soft_time_limit
from celeryapp.worker.attempt_check import asking_the_database
from celeryapp.worker.database_patience import patiently
from celeryapp.worker.dispatch import apply_effects
from celeryapp.worker.heartbeat import Interrupt, StepWatch
from celeryapp.worker.step_events import RunnerAnswer, step_result
from celeryapp.worker.step_log import capturing_log, traceback_text
from models import ActivityStatus, utcnow
from models.session import autocommit, connection

logger = logging.getLogger(__name__)

#: A step with a timeout advances its run itself only with at least this long left before its
#: soft time limit: the limit's exception must not land while the next group is being sent.
ADVANCE_MARGIN_S = 5.0


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _storable(text: str | None, limit: int = ERROR_CHARS, *, keep_end: bool = False) -> str | None:
    """Step code writes what it likes: keep at most ``limit`` characters (the start, or the end
    for a traceback and log lines), with NUL (which PostgreSQL refuses in text) and lone
    surrogates (which no driver can encode) made visible instead."""
    if text is None:
        return None
    kept = text[-limit * 2 :] if keep_end else text[: limit * 2]
    visible = kept.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
    return visible[-limit:] if keep_end else visible[:limit]


class Outcome(NamedTuple):
    """An attempt's outcome as recorded on its activity."""

    status: ActivityStatus
    error: str | None
    message: str | None
    #: The step's own failure's traceback.
    traceback: str | None = None
    #: The last lines the step logged (and an executable's output).
    log_tail: str | None = None


def _timed_out(claim: Claim) -> Outcome:
    return Outcome(ActivityStatus.FAILED_WITH_ERROR, f"timed out after {claim.spec.timeout_s:g}s", None)


def _interrupted(claim: Claim, watch: StepWatch) -> Outcome:
    """The watch interrupted the step: its timeout passed, its execution was cancelled, or recovery
    gave the attempt up (its outcome is then fenced off and changes nothing). (A lease that ran
    out records no outcome at all: see ``run_step``.)"""
    if watch.timed_out:
        return _timed_out(claim)
    if watch.fenced:
        return Outcome(ActivityStatus.CANCELLED, "stopped: recovery gave this attempt up", None)
    if watch.stopped is not None:
        return Outcome(ActivityStatus.CANCELLED, watch.stopped, None)
    return Outcome(ActivityStatus.CANCELLED, "cancelled", None)


def execute_step(app: Runtime, claim: Claim, watch: StepWatch) -> Outcome:
    """Run the step's task; return its outcome, with the last lines it logged.

    The task is checked against this worker's rules first: a plan stored before the policy
    tightened, or a step of a kind switched off since, fails instead of running.
    """
    with capturing_log() as log:
        outcome = _execute(app, claim, watch)
    if outcome.status in (ActivityStatus.FAILED_WITH_ERROR, ActivityStatus.COMPLETE_WITH_ERROR):
        # The worker log's own line for the step: Celery's line for the runner says "succeeded"
        # whatever the step did (the runner never fails, see step_events.py; trace_log.py
        # rewrites that line too).
        logger.warning(
            "step %r of execution %s (group %s, attempt %s) failed%s: %s",
            claim.spec.name,
            claim.execution_id,
            claim.step_index + 1,
            claim.attempt,
            " (continue_on_failure: the run goes on)" if claim.spec.continue_on_failure else "",
            # As stored: step code's NUL or lone surrogate in a log line breaks a log file's
            # encoder (and pytest-xdist's report of the test that logged it).
            _storable(outcome.error),
        )
    return outcome._replace(log_tail=log.text())


def _execute(app: Runtime, claim: Claim, watch: StepWatch) -> Outcome:
    refusal = StepRules.of(app.settings, app.tasks.__contains__).spec_refusal(claim.spec.kind, claim.spec.task)
    try:
        try:
            if refusal is not None:
                return Outcome(ActivityStatus.FAILED_WITH_ERROR, f"refused on this worker: {refusal}", None)
            if watch.lease_lost:
                return Outcome(ActivityStatus.CANCELLED, "not started: its lease ran out", None)  # not recorded
            if watch.interrupted is Interrupt.RUNNING_ELSEWHERE:
                return Outcome(ActivityStatus.CANCELLED, "not started: running elsewhere", None)  # not recorded
            if watch.stopped is not None:
                return Outcome(ActivityStatus.CANCELLED, watch.stopped, None)  # revoked before it started
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
        # Its message is shown as widely as its traceback: the same secrets hidden.
        return Outcome(ActivityStatus.FAILED_WITH_ERROR, hide_secrets(_error_text(exc)), None, traceback_text(exc))
    status, message = classify(result)
    return Outcome(status, message if status.failed else None, None if status.failed else message)


def _record(app: Runtime, claim: Claim, outcome: Outcome) -> Recorded | Exception:
    url = app.settings.database_url
    status = outcome.status
    fields = {
        "error": _storable(outcome.error),
        "message": _storable(outcome.message),
        "traceback": _storable(outcome.traceback, TRACEBACK_CHARS, keep_end=True),
        "log_tail": _storable(outcome.log_tail, LOG_TAIL_CHARS, keep_end=True),
    }

    admitted = Effects()

    def once() -> Recorded:
        nonlocal admitted
        if not claim.spec.uses:
            with autocommit(url) as conn:
                return finish_step(conn, claim, status, now=utcnow(), **fields)
        # Its slots are the attempt's lease: given back in the transaction that records its outcome.
        with connection(url) as conn:
            now = utcnow()
            recorded = finish_step(conn, claim, status, now=now, **fields)
            admitted = release_attempt(conn, claim.worker_task_id, claim.attempt, now=now)
        return recorded

    # Not a failure the step did not have in its place, ever: the outcome is true or nothing is
    # written. Given up, the activity stays in progress and, its heartbeat gone, recovery runs the
    # attempt again as after a lost worker.
    recorded = patiently(f"recording the outcome ({status.value}) of {claim.spec.name!r} attempt {claim.attempt}", once)
    if admitted.dispatch or admitted.limit_wakes:
        try:
            apply_effects(app, admitted)
        except Exception:
            # Committed queued: recovery sends them (no dispatch marker), as any message lost before publish.
            logger.warning(
                "steps admitted by %r's release not sent; recovery sends them", claim.spec.name, exc_info=True
            )
    return recorded


def _claim(app: Runtime, worker_task_id: int, attempt: int, node: str) -> tuple[Claim | Exception | None, float]:
    """The claim (``None``: not ours to run; an error: the database did not let it), and when its
    successful try was sent (monotonic: recovery counts a lost attempt's time from the claim)."""
    url = app.settings.database_url
    sent = time.monotonic()
    #: A claim made whose COMMIT failed (the connection lost on the way: a pooler restarted, a
    #: network cut), with when it was made and sent: it may have committed unseen.
    unsure: tuple[Claim, datetime, float] | None = None

    def once() -> Claim | None:
        nonlocal sent, unsure
        sent = time.monotonic()
        now = utcnow()
        made: Claim | None = None
        # A transaction even for PostgreSQL's single statement: the claim commits only once
        # its runner, alive, asks for it. Alone it would commit whenever the statement ran,
        # and a worker killed while it waited (a locked table, a stalled server) would leave
        # an attempt claimed that nothing runs: recovery would fail it and use up an attempt.
        try:
            with connection(url) as conn:
                made = claim_step(conn, worker_task_id, attempt, node=node, now=now)
        except Exception:
            if made is not None:
                unsure = (made, now, sent)
            raise
        if made is None and unsure is not None:
            # Nothing left to claim: if it is because the unsure claim did commit, it is ours
            # to run (else nothing would, until recovery gave the attempt up as lost).
            earlier, made_at, earlier_sent = unsure
            with autocommit(url, read_only=True) as conn:
                if claim_committed(conn, earlier, node=node, now=made_at):
                    sent = earlier_sent
                    return earlier
        return made

    return patiently(f"claiming worker task {worker_task_id} attempt {attempt}", once), sent


def run_step(app: Runtime, worker_task_id: int, attempt: int, *, node: str, token: int = 0) -> dict[str, Any]:
    """Run an attempt of the run whose token is ``token`` (0: a message sent before runs had one)."""
    entered = time.monotonic()  # about when the main process started the soft limit's timer
    soft_time_limit.install()
    settings = app.settings
    client = get_redis(settings.broker_url)
    # The pickup lease was taken when the worker received the message (signals.py). Kept while
    # the claim waits for the database, and deleted after it: claimed, the attempt is past needing
    # one; not claimed, recovery sends the attempt again once the lease is gone (a duplicate of
    # a message still retrying elsewhere is harmless: only one claim can win).
    with StepWatch.keep_alive(client, keys.pickup_key(worker_task_id, attempt, token), settings.heartbeat_ttl_s):
        claim, claim_sent = _claim(app, worker_task_id, attempt, node)
    if not isinstance(claim, Claim):
        # Nothing was claimed, so nothing runs here; the attempt is still queued in the database.
        if claim is None:
            logger.info("worker task %s attempt %s is not runnable here (duplicate or fenced)", worker_task_id, attempt)
            return RunnerAnswer.SKIPPED.result()
        logger.error(
            "could not claim worker task %s attempt %s (%s); recovery sends it again", worker_task_id, attempt, claim
        )
        return RunnerAnswer.UNCLAIMED.result()
    context = StepContext(
        claim.execution_id,
        claim.schedule_name,
        claim.spec.name,
        claim.step_index,
        claim.attempt,
        claim.payload,
        claim.spec.timeout_s,
        claim.slot,
        claim.token,
    )
    watch = StepWatch(
        client,
        # Named with the run's token as the database has it, not the message's: a message of a run
        # lost with a database that went back claims the new run that reuses its ids as its own.
        heartbeat_key=keys.heartbeat_key(worker_task_id, attempt, claim.token),
        cancel_key=keys.cancel_key(claim.execution_id, claim.token),
        fenced_key=keys.fenced_key(worker_task_id, attempt, claim.token),
        stop_key=keys.stop_key(worker_task_id, attempt, claim.token),
        ttl_s=settings.heartbeat_ttl_s,
        timeout_s=claim.spec.timeout_s,
        since=claim_sent,
    )
    started = time.monotonic()
    # The heartbeat is kept until the outcome is recorded: a step whose outcome waits for the
    # database has not ended, and must not be taken for a lost one and run again. A long step also
    # asks the database whether its attempt is still the one running (a cancel whose Redis flag
    # was never written, or was lost, stops it all the same: attempt_check.py).
    every_s = settings.recovery_interval_s
    url = settings.database_url
    with (
        watch,
        asking_the_database(watch, database_url=url, worker_task_id=worker_task_id, attempt=attempt, every_s=every_s),
    ):
        try:
            with running_step(context), soft_time_limit.due(claim.spec.timeout_s, since=entered):
                outcome = execute_step(app, claim, watch)
        except StepCancelled:
            # Landed between the step's return and the watch's disarming.
            outcome = _interrupted(claim, watch)
        if watch.lease_lost:
            # No outcome: to recovery the attempt is lost (its heartbeat expires or is deleted
            # now), and it is run again as after a lost worker, under a new attempt number.
            logger.warning(
                "step %r of execution %s attempt %s stopped: its lease ran out (Redis out of reach); "
                "recovery runs it again",
                claim.spec.name,
                claim.execution_id,
                claim.attempt,
            )
            return RunnerAnswer.LEASE_LOST.result()
        if watch.interrupted is Interrupt.RUNNING_ELSEWHERE:
            _release(app, claim, node)
            return RunnerAnswer.SKIPPED.result()
        recorded = _record(app, claim, outcome)
    if not isinstance(recorded, Recorded):
        return RunnerAnswer.UNRECORDED.result()
    timeout_s = claim.spec.timeout_s
    if recorded.last_of_group and (not timeout_s or time.monotonic() - started < timeout_s - ADVANCE_MARGIN_S):
        _advance_now(app, claim, recorded)
    if not recorded.closed:
        return _superseded(app, claim)
    return step_result(outcome.status, outcome.error, outcome.message, outcome.traceback)


def _release(app: Runtime, claim: Claim, node: str) -> None:
    """Another runner's heartbeat of this very attempt: the database lost that runner's claim (it
    went back), and this claim must not run beside it (see recovery/lost_claims.py)."""
    try:
        with connection(app.settings.database_url) as conn:
            release_claim(conn, claim, node=node)
    except Exception:
        # Left processing here, under the other's heartbeat: recovery waits for it as for any.
        logger.warning(
            "worker task %s attempt %s: claim not undone", claim.worker_task_id, claim.attempt, exc_info=True
        )
    else:
        logger.error(
            "worker task %s attempt %s already runs elsewhere (its heartbeat beats; the database lost that "
            "claim): not run here, queued again for once it ended",
            claim.worker_task_id,
            claim.attempt,
        )


def _superseded(app: Runtime, claim: Claim) -> dict[str, Any]:
    """What monitors are told when the attempt's outcome changed nothing: someone closed its
    activity first (its run was cancelled, recovery gave the attempt up), and what they recorded
    is the truth, e.g. ``cancelled`` with the cancel's reason, not the runner's view of it."""
    try:
        with autocommit(app.settings.database_url) as conn:
            stored = stored_outcome(conn, claim)
    except Exception:
        logger.warning("attempt %s of %r: its stored outcome not read", claim.attempt, claim.spec.name, exc_info=True)
        stored = None
    if stored is None:
        return RunnerAnswer.FENCED.result()
    return step_result(*stored, None) | {"superseded": True}


def _advance_now(app: Runtime, claim: Claim, recorded: Recorded) -> None:
    """The group's last attempt has ended: advance its run now, in this process, instead of after
    the chord's body went round (the group's count in Redis, a message, a free pool process: about
    half of a group-to-group hop, docs/performance.md). The body still runs; the run being past the group by then,
    its compare-and-set changes nothing. It is also the backstop: should this fail, or two last
    attempts end at once and each count the other, the body advances the run as before."""
    url = app.settings.database_url
    try:
        effects = advance_group(url, claim.execution_id, claim.step_index, now=utcnow(), state=recorded.group)
        apply_effects(app, effects)
    except Exception:
        logger.warning(
            "execution %s group %s: not advanced at once; its chord's body will",
            claim.execution_id,
            claim.step_index,
            exc_info=True,
        )
