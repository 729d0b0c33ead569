"""Redis key names and queue names, all in one place under the ``chordbeat`` prefix."""

from __future__ import annotations

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


#: Lowest message priority on Redis (0 is the highest).
LOWEST_PRIORITY = 9


def step_priority(step_index: int) -> int:
    """Later groups go first: 9 for group 0, 8 for group 1, ... 0 from group 9 on."""
    return max(0, LOWEST_PRIORITY - step_index)


def heartbeat_key(worker_task_id: int, attempt: int) -> str:
    """Key a running step refreshes; its expiry means the attempt's worker is gone."""
    return f"{PREFIX}:hb:{worker_task_id}:{attempt}"


def dispatch_marker_key(worker_task_id: int, attempt: int) -> str:
    """Set when an attempt's message is published; its absence for a queued attempt means the
    message never left or Redis lost it, and recovery sends it again."""
    return f"{PREFIX}:sent:{worker_task_id}:{attempt}"


def pickup_key(worker_task_id: int, attempt: int) -> str:
    """Set, with the heartbeat's TTL, when a worker takes an attempt's message and until its claim
    commits. The dispatch marker gives way to it: a worker dying (or its claim failing) between
    taking the message and committing the claim lets it expire, and recovery sends the attempt
    again instead of waiting for the broker's visibility timeout."""
    return f"{PREFIX}:pickup:{worker_task_id}:{attempt}"


def fenced_key(worker_task_id: int, attempt: int) -> str:
    """Set by recovery when it gives an attempt up (its heartbeat stopped): if that attempt is in
    fact still running somewhere (a frozen worker, a Redis stall), its watch stops it."""
    return f"{PREFIX}:fenced:{worker_task_id}:{attempt}"


def stop_key(worker_task_id: int, attempt: int) -> str:
    """Set by a worker when an operator terminates or revokes the attempt's message (Flower's
    Terminate and Revoke, ``celery control revoke``); its value is the reason. The attempt's watch
    stops the step, which is then recorded cancelled: the group advances, and nothing re-runs it."""
    return f"{PREFIX}:stop:{worker_task_id}:{attempt}"


def cancel_key(execution_id: int) -> str:
    """Key whose presence tells running steps of an execution to stop."""
    return f"{PREFIX}:cancel:{execution_id}"


def runner_task_id(execution_id: int, worker_task_id: int, attempt: int) -> str:
    """Deterministic Celery task id of a step runner: revocable and recognisable when redelivered.

    Ids are never reused (tables are AUTOINCREMENT on SQLite too), so a revoked id cannot hit a
    later run.
    """
    return f"{PREFIX}-e{execution_id}-wt{worker_task_id}-a{attempt}"
