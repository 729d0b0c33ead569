"""Fires beat sent that no control worker has taken yet: beat sends no other for their schedules.

While no control worker consumes the control queue, a fire per slot and schedule piled up in
Redis (Celery's ``expires`` is only looked at by the worker that takes a message, so an expired
message stays until then): 10,000 minutely schedules over a weekend came to about 3 GB. Instead
beat remembers which message holds each schedule's last regular fire, and a marker key in the
broker's Redis, beside the message, says it is still queued. The worker that takes the message
deletes it, as does one that drops it unread (expired or revoked: ``task_revoked``); lost with
Redis's data, the marker goes with the message. The slots beat passes meanwhile are not fired;
beat holds the latest of each schedule's, and fires it as soon as the marker is gone (a control
worker took the old fire, which it records superseded): the schedule runs once, for its latest
missed slot, and that fire records the slots between ``missed`` (docs/schedules.md).

A marker whose message vanished without any worker seeing it (a purged queue) holds its
schedules back for :data:`MARKER_TTL_S` at most; meanwhile the lost-slot re-fire still runs their
slots, late, whenever a control worker runs. Beat keeps the message of each schedule in memory:
a restarted or standby beat sends at most one more fire per schedule.

Cost: one pipelined write per tick that fires (not per schedule), and one pipelined check per
tick that fires schedules fired before. While slots are held, one more round trip a second looks
for their markers.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import redis

from celeryapp.messaging.keys import queued_fire_key

logger = logging.getLogger(__name__)

#: A regular slot's fire as beat sends it, and when its message expires.
Slot = tuple[dict[str, str], datetime]

#: Longest a fire message is taken for queued (a day): the backlog without any control worker is
#: one message per schedule and day at most.
MARKER_TTL_S = 86_400


class QueuedFires:
    """Which fire message (its Celery task id) holds each schedule's last regular fire."""

    def __init__(self) -> None:
        self._message_of: dict[str, str] = {}
        #: The latest slot passed unfired, by schedule: fired once its schedule's marker is gone.
        self._held: dict[str, Slot] = {}

    @property
    def holding(self) -> bool:
        return bool(self._held)

    def hold(self, slots: Iterable[Slot]) -> None:
        for fire, expires in slots:
            self._held[fire["name"]] = (fire, expires)

    def ask_held(self, pipe: Any) -> list[str]:
        """Queue on ``pipe`` whether the messages the held slots wait for are still queued."""
        return self.ask(pipe, self._held)

    def released(self, asked: Sequence[str], replies: Sequence[Any], now: datetime) -> list[Slot]:
        """The held slots whose schedule's last fire was taken, from the replies to :meth:`ask_held`;
        no longer held. One whose expiry passed is dropped: a newer slot of its schedule was due."""
        waiting = self.still_queued(self._held, asked, replies)
        free = [slot for name, slot in self._held.items() if name not in waiting]
        self._held = {name: slot for name, slot in self._held.items() if name in waiting and slot[1] > now}
        return [(fire, expires) for fire, expires in free if expires > now]

    def ask(self, pipe: Any, names: Iterable[str]) -> list[str]:
        """Queue on ``pipe`` whether the last messages of ``names`` are still queued; the message
        ids asked, in order (their replies come first when the pipeline was empty)."""
        asked = sorted({self._message_of[n] for n in names if n in self._message_of})
        for message_id in asked:
            pipe.exists(queued_fire_key(message_id))
        return asked

    def still_queued(self, names: Iterable[str], asked: Sequence[str], replies: Sequence[Any]) -> set[str]:
        """Those of ``names`` whose last fire is still queued, from the replies to :meth:`ask`."""
        waiting = {message_id for message_id, found in zip(asked, replies, strict=True) if found}
        return {name for name in names if self._message_of.get(name) in waiting}

    def sending(self, client: redis.Redis, messages: Sequence[tuple[str, list[str]]]) -> None:
        """Mark the messages about to be sent, each ``(message id, its regular slots' schedules)``,
        as queued (written before the message exists: a worker may take it at once)."""
        with client.pipeline(transaction=False) as pipe:
            for message_id, _names in messages:
                pipe.set(queued_fire_key(message_id), "1", ex=MARKER_TTL_S)
            pipe.execute()
        for message_id, names in messages:
            for name in names:
                self._message_of[name] = message_id
                self._held.pop(name, None)

    def not_sent(self, client: redis.Redis, message_id: str) -> None:
        """A message that could not be sent holds nothing back."""
        self._message_of = {n: m for n, m in self._message_of.items() if m != message_id}
        try:
            client.delete(queued_fire_key(message_id))
        except redis.RedisError:
            logger.warning("beat: could not clear the marker of unsent fire message %s", message_id)


def taken(client: redis.Redis, message_id: str) -> None:
    """Said by the worker that took (or dropped unread) a fire message: its schedules may be fired
    again. A failure is logged: beat then holds them back until the marker expires."""
    try:
        client.delete(queued_fire_key(message_id))
    except redis.RedisError as exc:
        logger.warning("fire message %s: could not say it was taken (%s)", message_id, exc)
