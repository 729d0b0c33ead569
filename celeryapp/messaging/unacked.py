"""Messages a worker took from the broker and never acknowledged.

kombu's Redis transport keeps every message a consumer has taken, until it is acknowledged, in
the ``unacked`` hash (delivery tag → the message) with the time it was taken in ``unacked_index``;
it puts such a message back only after the visibility timeout (hours). A worker killed between
taking a step's message and noting its pickup (:func:`celeryapp.worker.dispatch.take_message`)
leaves the step's dispatch marker behind, which tells recovery the message is on its way: without
looking here, the run would wait for that timeout.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import redis

from celeryapp.messaging import keys

#: kombu's Redis transport's keys (kombu.transport.redis.Channel.unacked_key, unacked_index_key).
UNACKED_KEY = "unacked"
UNACKED_INDEX_KEY = "unacked_index"


def _task_id(raw: object, *, in_unacked: bool = True) -> str | None:
    """The Celery task id of an ``unacked`` entry (``[message, exchange, routing_key]``), or of a
    message waiting in a queue's list (the message alone), if any."""
    try:
        message = json.loads(raw)[0] if in_unacked else json.loads(raw)  # type: ignore[arg-type]
        task_id = message["headers"]["id"]
    except (ValueError, TypeError, KeyError, IndexError, RecursionError):
        # Not a Celery task message of ours (RecursionError: JSON nested too deep for the
        # decoder, written by anyone with access to Redis): nothing to match.
        return None
    return task_id if isinstance(task_id, str) else None


def taken_before(client: redis.Redis, task_ids: Iterable[str], before: float) -> dict[str, str]:
    """The delivery tags of the messages of ``task_ids`` that a consumer took before ``before``
    (epoch seconds) and has not acknowledged, by task id."""
    wanted = set(task_ids)
    tags: list[str] = list(client.zrangebyscore(UNACKED_INDEX_KEY, "-inf", before)) if wanted else []  # type: ignore[arg-type]
    if not tags:
        return {}
    found: dict[str, str] = {}
    for tag, raw in zip(tags, client.hmget(UNACKED_KEY, tags), strict=True):
        task_id = _task_id(raw)  # None for a missing entry (json.loads(None): TypeError)
        if task_id is not None and task_id in wanted:
            found[task_id] = tag
    return found


def vanished(client: redis.Redis, task_ids: Iterable[str], queues: Iterable[str], max_scan: int) -> set[str] | None:
    """Of ``task_ids``, those whose message neither waits in one of ``queues`` nor was taken and
    left unacknowledged: a worker popped it and never got the answer (cut off mid-read, then
    killed), and kombu keeps no trace of it. ``None`` when the queues hold more than ``max_scan``
    messages: a backlog too long to read, where a message most likely still waits.

    The queues are read before the unacknowledged set: a message a live worker takes meanwhile is
    found in the latter. One taken in the instant between the two reads is reported (its pop
    answered, its unacked entry not yet written): sending it again makes a harmless duplicate.
    """
    wanted = set(task_ids)
    if not wanted:
        return set()
    lists = [key for queue in queues for key in keys.queue_keys(queue)]
    with client.pipeline(transaction=False) as pipe:
        for key in lists:
            pipe.llen(key)
        lengths = [int(n) for n in pipe.execute()]
    if sum(lengths) > max_scan:
        return None
    with client.pipeline(transaction=False) as pipe:
        for key, length in zip(lists, lengths, strict=True):
            if length:
                pipe.lrange(key, 0, -1)
        waiting = {_task_id(raw, in_unacked=False) for entries in pipe.execute() for raw in entries}
    left = wanted - waiting
    return left - set(taken_before(client, left, float("inf"))) if left else set()


def forget(client: redis.Redis, tags: Iterable[str]) -> None:
    """Drop deliveries from the broker's unacknowledged set: their messages were sent again, and
    kombu must not also put the old ones back."""
    tags = list(tags)
    if tags:
        with client.pipeline(transaction=False) as pipe:
            pipe.hdel(UNACKED_KEY, *tags)
            pipe.zrem(UNACKED_INDEX_KEY, *tags)
            pipe.execute()
