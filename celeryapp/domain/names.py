"""The names chordbeat gives what others see: queues, run keys, and its Celery task ids."""

from __future__ import annotations

from datetime import datetime

from celeryapp.domain.times import iso
from celeryapp.states import Trigger

#: Prefix of every Redis key and Celery task id chordbeat makes.
PREFIX = "chordbeat"
#: Queue of step runners unless a step names its own queue.
STEPS_QUEUE = "chordbeat"
#: Queue of short control tasks (advancement, firing, service calls, recovery). Kept apart so an
#: advancement never waits behind a backlog of step messages.
CONTROL_QUEUE = "chordbeat.control"
#: Celery's default queue: where other services' ``send_task`` calls arrive without routing.
PUBLIC_QUEUE = "celery"
#: Queues of the control worker. No step may run there: a long step would hold the slot a service
#: call or an advancement is waiting for.
CONTROL_QUEUES = frozenset({CONTROL_QUEUE, PUBLIC_QUEUE})


def run_key(name: str, trigger: Trigger, nominal_at: datetime, retry: int = 0) -> str:
    """The same slot (and retry) always gives the same key: two beats or a redelivery make one run."""
    kind = f"retry{retry}" if trigger is Trigger.RETRY else trigger.value
    return f"{name}:{kind}:{iso(nominal_at)}"


def runner_task_id(execution_id: int, worker_task_id: int, attempt: int, token: int) -> str:
    """Deterministic Celery task id of a step runner: revocable and recognisable when redelivered.

    Ids are not reused (tables are AUTOINCREMENT on SQLite too) unless the database goes back (a
    failover to an asynchronous standby): the run's random ``token`` keeps a revoked id from
    hitting a later run with the same ids.
    """
    return f"{PREFIX}-e{execution_id}-wt{worker_task_id}-a{attempt}{token_suffix(token, '-r')}"


def token_suffix(token: int, separator: str) -> str:
    """How a run's token ends its names; nothing for token 0 (runs started before tokens, whose
    names stay as they were)."""
    return f"{separator}{token:x}" if token else ""
