"""Redis key names, all in one place under the ``chordbeat`` prefix (the queue names are the
domain's: celeryapp/domain/names.py)."""

from __future__ import annotations

from celeryapp.domain.names import PREFIX, token_suffix

# The keys of a run and of its attempts end with the run's random token
# (models.tables.ScheduleExecution.token): ids a database that went back hands out again meet
# none of the lost run's keys.

#: Lowest message priority on Redis (0 is the highest).
LOWEST_PRIORITY = 9


#: kombu's Redis transport keeps priority ``p`` of queue ``q`` at ``q + SEP + p`` (``q`` for 0).
PRIORITY_SEP = "\x06\x16"


def priority_queue_key(queue: str, priority: int) -> str:
    """The Redis list of ``queue``'s messages of ``priority``, as kombu names it."""
    return queue if priority == 0 else f"{queue}{PRIORITY_SEP}{priority}"


def queue_keys(queue: str) -> list[str]:
    """The Redis lists of all ``queue``'s priorities."""
    return [priority_queue_key(queue, p) for p in range(LOWEST_PRIORITY + 1)]


def step_priority(step_index: int) -> int:
    """Later groups go first: 9 for group 0, 8 for group 1, ... 0 from group 9 on."""
    return max(0, LOWEST_PRIORITY - step_index)


def heartbeat_key(worker_task_id: int, attempt: int, token: int) -> str:
    """Key a running step refreshes; its expiry means the attempt's worker is gone."""
    return f"{PREFIX}:hb:{worker_task_id}:{attempt}{token_suffix(token, ':')}"


def dispatch_marker_key(worker_task_id: int, attempt: int, token: int) -> str:
    """Set when an attempt's message is published; its absence for a queued attempt means the
    message never left or Redis lost it, and recovery sends it again."""
    return f"{PREFIX}:sent:{worker_task_id}:{attempt}{token_suffix(token, ':')}"


def pickup_key(worker_task_id: int, attempt: int, token: int) -> str:
    """Set, with the heartbeat's TTL, when a worker takes an attempt's message and until its claim
    commits. The dispatch marker gives way to it: a worker dying (or its claim failing) between
    taking the message and committing the claim lets it expire, and recovery sends the attempt
    again instead of waiting for the broker's visibility timeout."""
    return f"{PREFIX}:pickup:{worker_task_id}:{attempt}{token_suffix(token, ':')}"


def queued_fire_key(message_id: str) -> str:
    """Present while beat's fire message ``message_id`` waits in the control queue (see
    celeryapp/scheduling/queued_fires.py): beat sends no other fire for its schedules meanwhile."""
    return f"{PREFIX}:fire:queued:{message_id}"


def fenced_key(worker_task_id: int, attempt: int, token: int) -> str:
    """Set by recovery when it gives an attempt up (its heartbeat stopped): if that attempt is in
    fact still running somewhere (a frozen worker, a Redis stall), its watch stops it."""
    return f"{PREFIX}:fenced:{worker_task_id}:{attempt}{token_suffix(token, ':')}"


def stop_key(worker_task_id: int, attempt: int, token: int) -> str:
    """Set by a worker when an operator terminates or revokes the attempt's message (Flower's
    Terminate and Revoke, ``celery control revoke``); its value is the reason. The attempt's watch
    stops the step, which is then recorded cancelled: the group advances, and nothing re-runs it."""
    return f"{PREFIX}:stop:{worker_task_id}:{attempt}{token_suffix(token, ':')}"


#: The highest ids Redis has seen, per table (a hash: ``EXECUTIONS_MARK``, ``WORKER_TASKS_MARK``, ...):
#: a database whose sequences are below them went back (celeryapp/recovery/database_rollback.py).
HIGH_WATER_KEY = f"{PREFIX}:high-water"
EXECUTIONS_MARK = "schedule_executions"
WORKER_TASKS_MARK = "worker_tasks"


def cancel_key(execution_id: int, token: int) -> str:
    """Key whose presence tells running steps of an execution to stop."""
    return f"{PREFIX}:cancel:{execution_id}{token_suffix(token, ':')}"


def limit_wake_key(limit_ids: tuple[int, ...], at_ms: int) -> str:
    """Present while a pass over these limits is on its way for that moment (ms since the epoch):
    one message for it, however many transactions ask."""
    return f"{PREFIX}:limit-wake:{','.join(map(str, limit_ids))}:{at_ms}"


def web_session_key(session_digest: str) -> str:
    """A dashboard session, by the digest of the id its cookie holds (so Redis holds no usable id)."""
    return f"{PREFIX}:web:session:{session_digest}"


def login_attempts_key(scope: str, who_digest: str) -> str:
    """Login attempts in the current window, per ``scope`` (``user`` or ``address``)."""
    return f"{PREFIX}:web:attempts:{scope}:{who_digest}"


def login_lock_key(who_digest: str) -> str:
    """Present while a user name is locked out of the dashboard's login; its TTL is the lockout left."""
    return f"{PREFIX}:web:lock:{who_digest}"


#: The set of worker node names that published what they can run (each entry under
#: :func:`registry_key` expires; names whose entry is gone are dropped when read).
REGISTRY_NODES_KEY = f"{PREFIX}:registry"


def registry_key(node: str) -> str:
    """A live worker's tasks, queues and step policy (monitoring/worker_registry.py), with a TTL."""
    return f"{PREFIX}:registry:{node}"
