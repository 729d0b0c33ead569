"""Messages a worker took from the broker and never acknowledged.

kombu's Redis transport keeps every message a consumer has taken, until it is acknowledged, in
the ``unacked`` hash (delivery tag → the message) with the time it was taken in ``unacked_index``;
it puts such a message back only after the visibility timeout (hours). A worker killed between
taking a step's message and noting its pickup (:func:`celeryapp.messaging.dispatch.take_message`)
leaves the step's dispatch marker behind, which tells recovery the message is on its way: without
looking here, the run would wait for that timeout.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import redis

#: kombu's Redis transport's keys (kombu.transport.redis.Channel.unacked_key, unacked_index_key).
UNACKED_KEY = "unacked"
UNACKED_INDEX_KEY = "unacked_index"


def _task_id(raw: object) -> str | None:
    """The Celery task id of an ``unacked`` entry (``[message, exchange, routing_key]``), if any."""
    try:
        message = json.loads(raw)[0]  # type: ignore[arg-type]
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


def forget(client: redis.Redis, tags: Iterable[str]) -> None:
    """Drop deliveries from the broker's unacknowledged set: their messages were sent again, and
    kombu must not also put the old ones back."""
    tags = list(tags)
    if tags:
        with client.pipeline(transaction=False) as pipe:
            pipe.hdel(UNACKED_KEY, *tags)
            pipe.zrem(UNACKED_INDEX_KEY, *tags)
            pipe.execute()
