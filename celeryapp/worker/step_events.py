"""What monitors (Flower, ``celery events``, ``celery inspect``) are told about a step.

A step runner is a chord header task that must never fail (a failed header makes the Redis
backend fail the chord body, which is the advancement). So the task itself always succeeds, and
the truth is told in the worker's task events instead, which is all Flower reads:

- the message carries a readable name (``<schedule>/<step>``, Celery's ``shadow``), and argument
  and keyword reprs naming the execution, the group (from 1) and the attempt (Flower's
  ``kwargs:execution=41`` is an exact match on the keyword repr's pairs);
- :class:`StepRequest` turns the runner's ``task-succeeded`` into ``task-failed`` (with the step's
  error and traceback) for a failed step and ``task-revoked`` for a cancelled one (also when the
  run's cancel closed the activity first: the runner then answers what was stored), and gives a
  completed step a readable result (its warning, if any);
- an operator's Terminate or Revoke (Flower's buttons, ``celery control revoke``; workers obey them
  only when ``CHORDBEAT_REMOTE_CONTROL`` names ``revoke``, see docs/security.md) does not kill
  the pool process or drop the message: it sets the attempt's stop flag
  (:func:`celeryapp.messaging.keys.stop_key`), and the runner records the step cancelled with the reason.
  Killing the process would make the attempt look like a lost worker that recovery runs again, and
  a dropped message would fail the group's chord.
"""

from __future__ import annotations

import ast
import logging
import re
import threading
import time
from enum import StrEnum
from typing import Any

import redis
from celery.worker import state as worker_state

from celeryapp.domain.names import PREFIX
from celeryapp.messaging import keys
from celeryapp.messaging.expiry import ReferenceClockRequest
from celeryapp.messaging.redis_client import get_redis
from celeryapp.runtime import Runtime
from models import ActivityStatus

logger = logging.getLogger(__name__)

#: Characters of a schedule or step name kept in the task name monitors show.
NAME_PART_CHARS = 80
#: The runner's result repr (what the worker reads the outcome from) holds a whole error and
#: traceback (``limits.ERROR_CHARS`` and ``limits.TRACEBACK_CHARS``, escaped).
RESULT_REPR_CHARS = 48 * 1024
#: How long an operator's stop flag lives. It is set when the worker holding the attempt's message
#: is told (Celery asks ``revoked`` before the runner claims, and the claim may wait up to
#: database_patience.DATABASE_PATIENCE_S, 10 minutes, for the database), and read by the step's watch from its
#: first heartbeat on: the wait, then as long as a cancel flag (dispatch.flag_ttl_ms) with room to
#: spare. Operators' stops are few: an hour's of them is nothing to hold.
STOP_FLAG_TTL_S = 3600
#: Seconds between two tries of a stop flag's write that failed (as often as a watch reads it).
STOP_RETRY_S = 0.5
TERMINATED = "terminated by operator"
REVOKED = "revoked by operator"


def _part(name: str) -> str:
    return name if len(name) <= NAME_PART_CHARS else name[: NAME_PART_CHARS - 1] + "…"


def shadow_name(schedule_name: str, step_name: str) -> str:
    """The name monitors show for a step's runner: ``nightly-hr-sync/extract``.

    Names are length-capped; they are not HTML-escaped here (logs and ``celery inspect`` show them
    as they are): Flower escapes what it renders.
    """
    return f"{_part(schedule_name)}/{_part(step_name)}"


def args_repr(execution_id: int, step_index: int, attempt: int) -> str:
    """What monitors show as the runner's arguments; groups are numbered from 1, as for people."""
    return f"(execution={execution_id}, group={step_index + 1}, attempt={attempt})"


def kwargs_repr(execution_id: int, step_index: int, attempt: int, worker_task_id: int) -> str:
    """What monitors show as the runner's keyword arguments: a dict literal, whose pairs Flower
    indexes, so that ``kwargs:execution=5`` finds execution 5's steps and not those of 50-59."""
    pairs = {"execution": execution_id, "group": step_index + 1, "attempt": attempt, "worker_task": worker_task_id}
    return repr(pairs)


class RunnerAnswer(StrEnum):
    """The runner's answer when it tells no outcome of the step (its ``status``, beside those of
    :class:`ActivityStatus`)."""

    #: Not runnable here: a duplicate, or an attempt fenced off or its run over.
    SKIPPED = "skipped"
    #: The database did not let the claim through; recovery sends the attempt again.
    UNCLAIMED = "unclaimed"
    #: The lease ran out while the step ran (Redis out of reach); recovery runs it again.
    LEASE_LOST = "lease_lost"
    #: The outcome could not be recorded; recovery runs the attempt again.
    UNRECORDED = "unrecorded"
    #: The outcome changed nothing and none other was found: the attempt was fenced meanwhile
    #: (recovery gave it up, and its run's history is gone). A run's cancel, or recovery's
    #: failing of the attempt, is answered as what they stored (:func:`step_result`).
    FENCED = "fenced"

    def result(self) -> dict[str, Any]:
        """As the runner returns it: a plain str, since monitors read the result back from its repr."""
        return {"status": self.value}


#: Answers for a message whose step did not run here at all.
_NOTHING_RAN = frozenset({RunnerAnswer.SKIPPED, RunnerAnswer.UNCLAIMED})
#: What a fenced attempt is told as: stopped, not a success.
FENCED_TEXT = "recovery gave this attempt up"


def step_result(
    status: ActivityStatus, error: str | None, message: str | None, traceback: str | None = None
) -> dict[str, Any]:
    """The runner's return value: the outcome, with the error (and traceback) or warning for monitors."""
    result: dict[str, Any] = {"status": status.value}
    if error is not None:
        result["error"] = error
    elif message is not None and status is ActivityStatus.COMPLETE_WITH_WARNING:
        result["warning"] = message
    if traceback is not None:
        result["traceback"] = traceback
    return result


def _outcome(retval: Any) -> dict[str, Any] | None:
    """The runner's result back from its pool process, where it became a repr."""
    if isinstance(retval, dict):
        return retval
    try:
        value = ast.literal_eval(retval) if isinstance(retval, str) else None
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, dict) and isinstance(value.get("status"), str) else None


_FAILED = {s.value for s in ActivityStatus if s.failed and s is not ActivityStatus.CANCELLED}


def event_for(retval: Any) -> tuple[str, dict[str, Any]]:
    """The event (type, fields) that tells the truth about a runner that returned ``retval``."""
    outcome = _outcome(retval)
    if outcome is None:
        return "task-succeeded", {"result": retval}
    status = outcome["status"]
    error = outcome.get("error")
    if status in _FAILED:
        return "task-failed", {"exception": f"{status}: {error}", "traceback": outcome.get("traceback") or ""}
    if status in (ActivityStatus.CANCELLED.value, RunnerAnswer.FENCED.value):
        if status == RunnerAnswer.FENCED.value:
            error = FENCED_TEXT
        return "task-revoked", {
            "exception": f"cancelled: {error}",
            "terminated": error == TERMINATED,
            "expired": False,
            "signum": None,
        }
    if "warning" in outcome:
        return "task-succeeded", {"result": f"{status}: {outcome['warning']}"}
    if status in _NOTHING_RAN:
        return "task-succeeded", {"result": f"{status}: nothing ran (duplicate, fenced or not claimable message)"}
    return "task-succeeded", {"result": status}


def stop_attempt(app: Runtime, args: Any, reason: str) -> bool:
    """Set the stop flag of the attempt a runner message stands for; False if it could not yet (a
    thread then tries again until Redis answers)."""
    try:
        worker_task_id, attempt, *tokens = (int(a) for a in args)
        (token,) = tokens or (0,)  # no token: sent before runs had one
    except (TypeError, ValueError):
        return False
    url, key = app.settings.broker_url, keys.stop_key(worker_task_id, attempt, token)
    try:
        get_redis(url).set(key, reason, ex=STOP_FLAG_TTL_S)
    except redis.RedisError as exc:
        # The operator was told the stop was taken: it must not be lost with the write.
        logger.warning("could not stop worker task %s attempt %s yet (%s): %s", worker_task_id, attempt, reason, exc)
        threading.Thread(target=_stop_later, args=(url, key, reason), name="chordbeat-stop-later", daemon=True).start()
        return False
    logger.warning("worker task %s attempt %s: %s; the step stops, recorded cancelled", worker_task_id, attempt, reason)
    return True


def _stop_later(url: str, key: str, reason: str) -> None:
    """The stop flag's write, tried again until Redis answers, for as long as the flag would live."""
    give_up = time.monotonic() + STOP_FLAG_TTL_S
    while time.monotonic() < give_up:
        time.sleep(STOP_RETRY_S)
        try:
            get_redis(url).set(key, reason, ex=STOP_FLAG_TTL_S)
        except redis.RedisError:
            continue
        logger.warning("%s: %s, set now that Redis answers; the step stops, recorded cancelled", key, reason)
        return


#: :func:`celeryapp.domain.names.runner_task_id`'s shape.
_RUNNER_ID = re.compile(rf"{PREFIX}-e(\d+)-wt\d+-a\d+(?:-r([0-9a-f]+))?")


def _execution_cancelled(app: Runtime, task_id: str) -> bool:
    match = _RUNNER_ID.fullmatch(task_id)
    if match is None:
        return False
    try:
        token = int(match[2], 16) if match[2] else 0
        return bool(get_redis(app.settings.broker_url).exists(keys.cancel_key(int(match[1]), token)))
    except redis.RedisError:
        return False


class StepRequest(ReferenceClockRequest):
    """The worker-side request of a step runner (``chordbeat.run_step``'s ``Request`` class)."""

    def send_event(self, type_: str, **fields: Any) -> None:
        if type_ == "task-succeeded":
            runtime = fields.get("runtime")
            type_, fields = event_for(fields.get("result"))
            # Only task-received names the task and its arguments, and it is not sent while the
            # worker's events are off (a worker started or restarted in the 5 s before Flower
            # switches them on): Flower then listed the step nameless, and no search found it.
            # Monitors merge the fields of every event into the task, so the end names it too.
            fields.update(runtime=runtime, name=self.name, args=self.argsrepr, kwargs=self.kwargsrepr)
        super().send_event(type_, **fields)

    def terminate(self, pool: Any, signal: Any = None) -> None:
        # Not the pool process: the step stops at its next bytecode and is recorded cancelled.
        # (A killed process looks like a lost worker, and recovery would run the attempt again.)
        stop_attempt(self.task.app, self.args, TERMINATED)

    def revoked(self) -> bool:
        if self.id in worker_state.revoked and not self._already_revoked:
            # Dropping the message would fail the group's chord (no advancement) and leave the
            # attempt queued in the database: it runs instead, and its runner records it cancelled.
            worker_state.revoked.discard(self.id)
            if not _execution_cancelled(self.task.app, self.id):
                stop_attempt(self.task.app, self.args, REVOKED)
            # (A step of a cancelled run needs no flag: its claim finds the run over.)
            return False
        result: bool = super().revoked()
        return result
