"""Attempts that run without the database knowing: their claim was lost when the database went back.

A PostgreSQL failover to an asynchronous standby loses the last commits it had acknowledged, while
Redis keeps what was written beside them. A claim lost that way leaves its attempt ``queued`` in
the database, with no dispatch marker nor pickup lease (the worker took the message and claimed),
but with a live heartbeat: a worker runs it. A lost re-queue leaves the attempt before it
``processing`` (or ``queued``) while the next attempt, claimed on the lost timeline, runs. To the
rest of recovery both look like lost messages or lost workers; sending the attempt (or the next
one) again would run the same attempt number, the documented fencing token, twice at once.

So recovery looks for a live heartbeat of the attempt the database has and of the few after it
first, and sends nothing while one beats: the step runs to its end where it runs. Its outcome
cannot be recorded (the database does not know its claim), so once its heartbeat is gone the
attempt is sent again as any lost one: the step runs once more, after the first ended, never beside
it. That re-run is what an asynchronous failover costs (docs/operations.md).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import redis

from celeryapp.messaging import keys

logger = logging.getLogger(__name__)

#: How many attempts past the database's are looked for: each is a re-queue and a claim the
#: database lost, and a re-queue waits for a heartbeat's TTL, so a rollback of minutes loses few.
ATTEMPTS_AHEAD = 3


def live_attempts(
    client: redis.Redis, attempts: Sequence[tuple[int, int, int]], *, from_next: bool = False
) -> list[int | None]:
    """For each (worker task id, attempt the database has, run token), the attempt of it whose heartbeat beats
    (that attempt itself unless ``from_next``, or one of the :data:`ATTEMPTS_AHEAD` after it), or
    ``None``. One pipelined round trip for all."""
    first = 1 if from_next else 0
    offsets = range(first, ATTEMPTS_AHEAD + 1)
    with client.pipeline(transaction=False) as pipe:
        for task_id, attempt, token in attempts:
            for offset in offsets:
                pipe.exists(keys.heartbeat_key(task_id, attempt + offset, token))
        beating = pipe.execute()
    found: list[int | None] = []
    width = len(offsets)
    for index, (_task_id, attempt, _token) in enumerate(attempts):
        replies = beating[index * width : (index + 1) * width]
        alive = [attempt + offset for offset, beats in zip(offsets, replies, strict=True) if beats]
        found.append(alive[-1] if alive else None)
    return found


def note_running_unclaimed(task_id: int, in_database: int, running: int, what: str) -> None:
    """Say loudly why recovery leaves an attempt alone that it would otherwise repair."""
    logger.warning(
        "worker task %s is %s at attempt %s in the database, but attempt %s of it is running (its heartbeat "
        "beats): the database lost the claim (it went back, e.g. a failover to an asynchronous standby). "
        "Not sent again while it runs; once it ends, it is sent again",
        task_id,
        what,
        in_database,
        running,
    )
