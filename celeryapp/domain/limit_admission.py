"""Which waiters of shared limits start now: the admission decision, pure.

A waiter needs a set of ``(limit, key, slots)``, all at once or none (a partial hold would hold a
slot while waiting for another, the deadlock of two such waiters). Waiters are taken in the order
of their *turn* and then of arrival. The turn is given when a waiter arrives (:func:`turn_of`):
one past the last turn of its own queue (the waiters needing the same limits and keys), but never
behind the oldest turn still waiting. A key with a hundred waiters holds turns ``t..t+99``; a key
that comes after them gets turn ``t``, and goes second, not hundred-and-first: keys are served
round-robin, and within a key first come, first served. A waiter that does not fit closes its
queue for the pass (nothing overtakes it in its own queue) but never the others'; one that can
never fit (it asks for more than the limit has) is reported, so that it is failed, not left to
block its queue.

A rate is a token bucket: a start takes one token; tokens come back at ``count`` per period, up to
``count`` (the burst). A waiter held back only by tokens is woken by time: the decision says when.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

#: The turn a first waiter takes (any number would do: only the order of turns matters).
FIRST_TURN = 0


@dataclass(frozen=True)
class Bucket:
    """A rate's tokens: ``level`` at ``at`` (reference clock), ``per_s`` back each second, at most ``capacity``."""

    capacity: int
    per_s: float
    level: float
    at: datetime

    def level_at(self, now: datetime) -> float:
        # A reference clock that went back (a corrected jump) gives no tokens and takes none.
        elapsed_s = max(0.0, (now - self.at).total_seconds())
        return min(float(self.capacity), self.level + elapsed_s * self.per_s)

    def take(self, now: datetime) -> Bucket:
        return replace(self, level=self.level_at(now) - 1.0, at=max(now, self.at))

    def next_token_at(self, now: datetime) -> datetime:
        """When the bucket holds a whole token again."""
        missing = 1.0 - self.level_at(now)
        return max(now, self.at) + timedelta(seconds=max(0.0, missing) / self.per_s)


@dataclass(frozen=True)
class LimitState:
    """One limit as the decision sees it: its size and what is held of it now."""

    slots: int
    in_use: int = 0
    per_key_slots: int | None = None
    #: Slots held per key (keys holding none may be left out).
    key_in_use: Mapping[str, int] = field(default_factory=dict)
    bucket: Bucket | None = None

    def room(self, key: str) -> int:
        room = self.slots - self.in_use
        if self.per_key_slots is not None:
            room = min(room, self.per_key_slots - self.key_in_use.get(key, 0))
        return room

    def capacity(self) -> int:
        return self.slots if self.per_key_slots is None else min(self.slots, self.per_key_slots)

    def hold(self, key: str, slots: int, now: datetime) -> LimitState:
        keys = dict(self.key_in_use)
        keys[key] = keys.get(key, 0) + slots
        bucket = None if self.bucket is None else self.bucket.take(now)
        return replace(self, in_use=self.in_use + slots, key_in_use=keys, bucket=bucket)


@dataclass(frozen=True, order=True)
class Need:
    limit: str
    key: str
    slots: int = 1


@dataclass(frozen=True)
class Waiter:
    """A holder waiting for all its ``needs`` at once. ``turn`` from :func:`turn_of`, ``arrival``
    unique and growing (the first row's id): together they order the waiters."""

    holder: int
    turn: int
    arrival: int
    needs: frozenset[Need]

    @property
    def queue(self) -> frozenset[tuple[str, str]]:
        return queue_of(self.needs)


@dataclass(frozen=True)
class Admission:
    #: Holders to start now, in the order they were admitted.
    admitted: tuple[int, ...]
    #: Holders that can never be admitted as the limits are now sized (or a limit is gone).
    impossible: tuple[int, ...]
    #: The limits after the admissions (only those that changed).
    limits: Mapping[str, LimitState]
    #: When a waiter held back only by a rate gets its token; ``None``: none is.
    wake_at: datetime | None


def queue_of(needs: Iterable[Need]) -> frozenset[tuple[str, str]]:
    """The queue a waiter joins: the limits and keys it needs (its slots count do not matter)."""
    return frozenset((need.limit, need.key) for need in needs)


def turn_of(oldest_waiting_turn: int | None, queue_last_turn: int | None) -> int:
    """The turn of a waiter arriving: after its own queue's last, never before the oldest waiting."""
    if oldest_waiting_turn is None:
        return FIRST_TURN if queue_last_turn is None else queue_last_turn + 1
    if queue_last_turn is None:
        return oldest_waiting_turn
    return max(oldest_waiting_turn, queue_last_turn + 1)


def order(waiters: Iterable[Waiter]) -> list[Waiter]:
    return sorted(waiters, key=lambda waiter: (waiter.turn, waiter.arrival))


def admit(limits: Mapping[str, LimitState], waiters: Sequence[Waiter], now: datetime) -> Admission:
    """Which of ``waiters`` start now (the same answer for the same input, in any order)."""
    state = dict(limits)
    admitted: list[int] = []
    impossible: list[int] = []
    closed: set[frozenset[tuple[str, str]]] = set()
    wake_at: datetime | None = None
    for waiter in order(waiters):
        if _never_fits(state, waiter):
            impossible.append(waiter.holder)
            continue
        if waiter.queue in closed:
            continue
        fits, token_at = _fits(state, waiter, now)
        if not fits:
            closed.add(waiter.queue)
            if token_at is not None:
                wake_at = token_at if wake_at is None else min(wake_at, token_at)
            continue
        for need in waiter.needs:
            state[need.limit] = state[need.limit].hold(need.key, need.slots, now)
        admitted.append(waiter.holder)
    changed = {name: value for name, value in state.items() if value is not limits[name]}
    return Admission(tuple(admitted), tuple(impossible), changed, wake_at)


def _never_fits(state: Mapping[str, LimitState], waiter: Waiter) -> bool:
    return any(need.limit not in state or need.slots > state[need.limit].capacity() for need in waiter.needs)


def _fits(state: Mapping[str, LimitState], waiter: Waiter, now: datetime) -> tuple[bool, datetime | None]:
    """Whether every need has room now; and, when only tokens are missing, when they come."""
    token_at: datetime | None = None
    for need in waiter.needs:
        limit = state[need.limit]
        if limit.room(need.key) < need.slots:
            return False, None
        if limit.bucket is not None and limit.bucket.level_at(now) < 1.0:
            at = limit.bucket.next_token_at(now)
            token_at = at if token_at is None else max(token_at, at)
    return token_at is None, token_at


def full_bucket(capacity: int, per_s: float, now: datetime) -> Bucket:
    """A new rate's bucket: full, so the first ``capacity`` starts go at once."""
    if not (capacity >= 1 and math.isfinite(per_s) and per_s > 0):
        raise ValueError(f"a bucket needs capacity >= 1 and a positive finite rate, got {capacity}, {per_s}")
    return Bucket(capacity, per_s, float(capacity), now)
