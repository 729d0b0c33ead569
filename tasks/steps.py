"""The step runner: the header task of every step group's chord."""

from __future__ import annotations

import logging
from typing import Any

from celery import Task
from celery.exceptions import Ignore
from celery.signals import celeryd_init

from celeryapp import app
from celeryapp.domain.limits import check_int
from celeryapp.domain.names import CONTROL_QUEUES, STEPS_QUEUE
from celeryapp.domain.redaction import RedactedResult
from celeryapp.errors import InvalidArgument
from celeryapp.worker import runner, step_events, trace_log
from models.session import get_engine
from models.tables import RUN_TOKEN_MAX

logger = logging.getLogger(__name__)


# No result is stored: nobody reads it. The chord still counts the step: with the Redis backend the
# header's part is recorded by on_chord_part_return, which runs whether or not a result is stored,
# and the body (an immutable advancement) takes no header results. Errors (a malformed message:
# the runner itself never raises) are stored, for whoever sent it.
@app.task(
    name="chordbeat.run_step",
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
    store_errors_even_if_ignored=True,
    # Flower's view of a step: FAILURE with its error, Terminate as a cancel (step_events.py).
    Request="celeryapp.worker.step_events:StepRequest",
    resultrepr_maxsize=step_events.RESULT_REPR_CHARS,
)
def run_step(self: Task, worker_task_id: int, attempt: int, token: int = 0) -> RedactedResult:
    check_int(worker_task_id, "worker_task_id", InvalidArgument)
    check_int(attempt, "attempt", InvalidArgument, high=1000)
    # 0: sent before runs had tokens (models.tables.ScheduleExecution.token).
    check_int(token, "token", InvalidArgument, low=0, high=RUN_TOKEN_MAX)
    queue = (self.request.delivery_info or {}).get("routing_key")
    if queue in CONTROL_QUEUES:
        # Published there by hand or by a definition stored before such queues were refused. Run
        # here, it would make control and service calls wait; moved with the same id and chord,
        # it completes its group as usual (a duplicate is skipped by the claim).
        # With what monitors show of it (Celery keeps the shadow name, not the argument reprs).
        reprs = {
            "argsrepr": getattr(self.request, "argsrepr", None),
            "kwargsrepr": getattr(self.request, "kwargsrepr", None),
        }
        self.signature_from_request(queue=STEPS_QUEUE, **reprs).apply_async()
        logger.warning(
            "worker task %s attempt %s arrived on %r: moved to %r", worker_task_id, attempt, queue, STEPS_QUEUE
        )
        raise Ignore()
    # Monitors read the outcome back from the result's repr (step_events.event_for): Celery's own
    # repr of a dict leaves newlines, backslashes and quotes in strings unescaped (a traceback, a
    # program's output), and could not be read back; this one is Python's.
    node = self.request.hostname or "unknown"
    return RedactedResult(runner.run_step(app, worker_task_id, attempt, node=node, token=token))


# Celery's "succeeded" line for a runner whose step failed says it failed (trace_log.py). Before the
# pool forks, so its processes, where the line is written, have it.
celeryd_init.connect(trace_log.install, weak=False)


@celeryd_init.connect
def load_database_driver(**_: Any) -> None:
    """Load the database's driver in the worker before its pool forks (and before the worker
    freezes what it has loaded): the pool processes share it instead of each importing their own
    copy at its first step (docs/performance.md, worker memory). Nothing connects yet."""
    try:
        get_engine(app.settings.database_url)
    except Exception:
        # Not this receiver's to refuse: the first step reports a database that cannot be used.
        logger.warning("database driver not loaded before the pool started", exc_info=True)
