"""Slots of shared limits taken and given back in the caller's transaction, never over a limit.

Every change locks the limit rows it touches first, in one order for all (by id, ``FOR UPDATE``;
SQLite's writer lock covers them all), so two transactions never wait for each other in a circle.
What is held is then read again under the locks, and every change is a guarded statement whose
count of rows is checked: a hold whose release already ran is not found again, and ``in_use``
never passes ``slots`` nor goes below zero.

A release admits the next waiters in the same transaction (:mod:`celeryapp.domain.limit_admission`
decides which): no waiter polls. The caller sends the admitted steps' messages after commit.
Times come from the reference clock. docs/limits.md says what a crash costs.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Row, Table, delete, func, insert, select, tuple_, update
from sqlalchemy.orm import Session

from celeryapp.domain.limit_admission import Bucket, LimitState, Need, Waiter, admit, turn_of
from celeryapp.domain.shared_limits import MAX_KEY_CHARS, MAX_SLOTS, MAX_USES, parse_rate
from celeryapp.errors import ChordbeatError, InvalidArgument, NotFound
from celeryapp.monitoring.metric_counts import observe_admissions
from models.base import utcnow
from models.limit_tables import LIMIT_HOLDS, LIMIT_WAITERS, LIMITS
from models.session import affected

#: Waiters one pass reads, oldest turn first: the decision's work is bounded, whatever the backlog.
#: One further back waits for a pass with fewer ahead of it.
PASS_WAITERS = 1000
#: A limit not locked by a pass, as that pass sees it: full, so its waiters wait for another pass,
#: and as large as a limit can be, so none of them is judged unable ever to fit.
_UNLOCKED = LimitState(slots=MAX_SLOTS, in_use=MAX_SLOTS)


class SlotAccountingError(ChordbeatError):
    """Raised when a guarded change of slots finds the rows not as the locks promised: a bug, never
    a caller's mistake; the transaction is rolled back rather than commit a wrong count."""


@dataclass(frozen=True)
class Holder:
    """Who holds or waits: one attempt of one step (the attempt number is its fence)."""

    worker_task_id: int
    attempt: int
    execution_id: int
    step_name: str


@dataclass(frozen=True)
class Demand:
    """A limit one step needs, its rendered key (``""``: the limit has none) and how many slots."""

    limit: str
    key: str = ""
    slots: int = 1


@dataclass(frozen=True)
class Admitted:
    """What a pass decided. ``started`` now hold their slots: send their step messages after
    commit. ``impossible`` can never fit the limits as sized now: their waits were removed, fail
    them. ``wake_at``: run :func:`settle` then (a rate's next token). ``recheck``: limits to
    :func:`settle` because a waiter needing them arrived while this pass held others' locks."""

    started: tuple[Holder, ...] = ()
    impossible: tuple[Holder, ...] = ()
    wake_at: datetime | None = None
    recheck: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Released:
    #: Slots given back (0: nothing was held, or it was released already).
    slots: int
    admitted: Admitted


def acquire_or_wait(
    session: Session, demands: Sequence[Demand], holder: Holder, *, now: datetime | None = None
) -> tuple[bool, Admitted]:
    """Take every slot of ``demands`` at once, or record ``holder`` as waiting for them all.

    ``True`` when held (also when this attempt holds them already: a redelivered message). The
    pass may admit other waiters too (a rate's token came back): they are in the answer.
    """
    now = now or utcnow()
    _check_demands(demands)
    ids = _limit_ids(session, [demand.limit for demand in demands])
    locked = _lock(session, set(ids.values()) | _co_needed(session, ids.values()))
    if not set(ids.values()) <= locked:
        raise NotFound(f"limit {next(n for n, i in ids.items() if i not in locked)!r} was deleted meanwhile")
    # Under the locks: two deliveries of one message at once get one answer, not two waits.
    if session.scalar(select(func.count()).select_from(LIMIT_HOLDS).where(*_of(LIMIT_HOLDS, holder))):
        return True, Admitted()
    if session.scalar(select(func.count()).select_from(LIMIT_WAITERS).where(*_of(LIMIT_WAITERS, holder))):
        return False, Admitted()
    pairs = [(ids[demand.limit], demand.key) for demand in demands]
    queue = queue_digest(pairs)
    oldest = session.scalar(select(func.min(LIMIT_WAITERS.c.turn)).where(LIMIT_WAITERS.c.limit_id.in_(ids.values())))
    last = session.scalar(select(func.max(LIMIT_WAITERS.c.turn)).where(LIMIT_WAITERS.c.queue == queue))
    turn = turn_of(oldest, last)
    session.execute(
        insert(LIMIT_WAITERS),
        [
            {
                "limit_id": ids[demand.limit],
                "worker_task_id": holder.worker_task_id,
                "attempt": holder.attempt,
                "execution_id": holder.execution_id,
                "step_name": holder.step_name,
                "key": demand.key,
                "slots": demand.slots,
                "needs": len(demands),
                "queue": queue,
                "turn": turn,
                "enqueued_at": now,
            }
            for demand in demands
        ],
    )
    admitted = _decide(session, locked, now)
    held = holder in admitted.started
    if holder in admitted.impossible:
        raise InvalidArgument("uses", f"asks for more slots than {', '.join(sorted(ids))} can ever give")
    others = tuple(h for h in admitted.started if h != holder)
    return held, Admitted(others, admitted.impossible, admitted.wake_at, admitted.recheck)


def release(session: Session, worker_task_id: int, attempt: int, *, now: datetime | None = None) -> Released:
    """Give back every slot this attempt holds and drop its waits, then admit the next waiters.

    Exactly this attempt's: an older attempt (fenced off) releases nothing of its successor's, and
    a release run twice gives back nothing the second time.
    """
    now = now or utcnow()
    where = (LIMIT_HOLDS.c.worker_task_id == worker_task_id, LIMIT_HOLDS.c.attempt == attempt)
    waits = (LIMIT_WAITERS.c.worker_task_id == worker_task_id, LIMIT_WAITERS.c.attempt == attempt)
    seed = set(session.scalars(select(LIMIT_HOLDS.c.limit_id).where(*where))) | set(
        session.scalars(select(LIMIT_WAITERS.c.limit_id).where(*waits))
    )
    if not seed:
        return Released(0, Admitted())
    locked = _lock(session, seed | _co_needed(session, seed))
    # Read again under the locks: a release that ran meanwhile left nothing to find.
    holds = session.execute(select(LIMIT_HOLDS.c.id, LIMIT_HOLDS.c.limit_id, LIMIT_HOLDS.c.slots).where(*where)).all()
    if holds and affected(session, delete(LIMIT_HOLDS).where(LIMIT_HOLDS.c.id.in_([h.id for h in holds]))) != len(
        holds
    ):
        raise SlotAccountingError(
            f"the holds of worker task {worker_task_id} attempt {attempt} changed under their locks"
        )
    given: dict[int, int] = defaultdict(int)
    for hold in holds:
        given[hold.limit_id] += hold.slots
    for limit_id, slots in sorted(given.items()):
        guarded = (
            update(LIMITS)
            .where(LIMITS.c.id == limit_id, LIMITS.c.in_use >= slots)
            .values(in_use=LIMITS.c.in_use - slots)
        )
        if affected(session, guarded) != 1:
            raise SlotAccountingError(f"limit {limit_id} holds fewer than the {slots} slots released")
    session.execute(delete(LIMIT_WAITERS).where(*waits))
    return Released(sum(given.values()), _decide(session, locked, now))


def settle(session: Session, limit_ids: Collection[int], *, now: datetime | None = None) -> Admitted:
    """Admit whoever fits now (after a resize, when a rate's token came back, on ``recheck``)."""
    locked = _lock(session, set(limit_ids) | _co_needed(session, limit_ids))
    return _decide(session, locked, now or utcnow())


def queue_digest(pairs: Iterable[tuple[int, str]]) -> str:
    """The queue of a waiter needing these (limit id, key) pairs: the same set, the same queue."""
    text = "\x1e".join(f"{limit_id}\x1f{key}" for limit_id, key in sorted(set(pairs)))
    return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()


def _check_demands(demands: Sequence[Demand]) -> None:
    if not demands:
        raise InvalidArgument("uses", "must name at least one limit")
    if len(demands) > MAX_USES:
        raise InvalidArgument("uses", f"must name at most {MAX_USES} limits, got {len(demands)}")
    if len({demand.limit for demand in demands}) != len(demands):
        raise InvalidArgument("uses", "names a limit twice")
    if any(not 1 <= demand.slots <= MAX_SLOTS for demand in demands):
        raise InvalidArgument("uses", f"asks for fewer than one slot of a limit, or more than {MAX_SLOTS}")
    if any(len(demand.key) > MAX_KEY_CHARS for demand in demands):
        # Rendered keys are checked where they are made (KeyTemplate.render); this is the column's length.
        raise InvalidArgument("key", f"must be at most {MAX_KEY_CHARS} characters")


def _of(table: Table, holder: Holder) -> tuple[Any, ...]:
    return (table.c.worker_task_id == holder.worker_task_id, table.c.attempt == holder.attempt)


def _limit_ids(session: Session, names: Sequence[str]) -> dict[str, int]:
    found = {
        name: limit_id
        for name, limit_id in session.execute(select(LIMITS.c.name, LIMITS.c.id).where(LIMITS.c.name.in_(names)))
    }
    missing = [name for name in names if name not in found]
    if missing:
        raise NotFound(f"limit {missing[0]!r} does not exist")
    return found


def _co_needed(session: Session, limit_ids: Collection[int]) -> set[int]:
    """The limits the first waiters of ``limit_ids`` also need: a pass locks them too, to admit them."""
    first = session.execute(_first_waiters(limit_ids, LIMIT_WAITERS.c.limit_id, LIMIT_WAITERS.c.needs)).all()
    others = [(row.worker_task_id, row.attempt) for row in first if row.needs > 1]
    found = {row.limit_id for row in first}
    if others:
        found |= set(session.scalars(select(LIMIT_WAITERS.c.limit_id).where(_holder_in(others)).distinct()))
    return found


def _first_waiters(limit_ids: Collection[int], *columns: Any) -> Any:
    """The first waiter rows of these limits in the order they are served (one index range each)."""
    return (
        select(LIMIT_WAITERS.c.worker_task_id, LIMIT_WAITERS.c.attempt, *columns)
        .where(LIMIT_WAITERS.c.limit_id.in_(limit_ids))
        .order_by(LIMIT_WAITERS.c.turn, LIMIT_WAITERS.c.id)
        .limit(PASS_WAITERS)
    )


def _holder_in(holders: Sequence[tuple[int, int]]) -> Any:
    """Rows of these (worker task, attempt) pairs, given as values: probes of the unique index."""
    return tuple_(LIMIT_WAITERS.c.worker_task_id, LIMIT_WAITERS.c.attempt).in_(holders)


def _lock(session: Session, limit_ids: set[int]) -> set[int]:
    """Lock the limits, by id, in one statement: the one order every transaction takes them in."""
    locked = select(LIMITS.c.id).where(LIMITS.c.id.in_(limit_ids)).order_by(LIMITS.c.id).with_for_update()
    return set(session.scalars(locked))


def _decide(session: Session, locked: set[int], now: datetime) -> Admitted:
    first = session.execute(_first_waiters(locked, *LIMIT_WAITERS.c)).all()
    if not first:
        return Admitted()
    others = sorted({(row.worker_task_id, row.attempt) for row in first if row.needs > 1})
    more = session.execute(select(LIMIT_WAITERS).where(_holder_in(others))).all() if others else []
    rows = list({row.id: row for row in [*first, *more]}.values())
    limits = {row.id: row for row in session.execute(select(LIMITS).where(LIMITS.c.id.in_(locked))).all()}
    by_holder: dict[tuple[int, int], list[Row[Any]]] = defaultdict(list)
    for row in rows:
        by_holder[(row.worker_task_id, row.attempt)].append(row)
    holders = list(by_holder)
    waiters = [
        Waiter(
            index,
            min(r.turn for r in by_holder[key]),
            min(r.id for r in by_holder[key]),
            frozenset(Need(str(r.limit_id), r.key, r.slots) for r in by_holder[key]),
        )
        for index, key in enumerate(holders)
    ]
    unlocked = {row.limit_id for row in rows if row.limit_id not in locked}
    states = {str(limit_id): _state(session, row, rows, now) for limit_id, row in limits.items()}
    states.update({str(limit_id): _UNLOCKED for limit_id in unlocked})
    admission = admit(states, waiters, now)
    started = [_start(session, by_holder[holders[index]], now) for index in admission.admitted]
    names = {limit_id: row.name for limit_id, row in limits.items()}
    observe_admissions(
        session,
        [
            (names[row.limit_id], (now - row.enqueued_at).total_seconds())
            for index in admission.admitted
            for row in by_holder[holders[index]]
        ],
    )
    impossible = [_holder(by_holder[holders[index]][0]) for index in admission.impossible]
    for index in admission.impossible:
        worker_task_id, attempt = holders[index]
        session.execute(
            delete(LIMIT_WAITERS).where(
                LIMIT_WAITERS.c.worker_task_id == worker_task_id, LIMIT_WAITERS.c.attempt == attempt
            )
        )
    for name, state in admission.limits.items():
        _store(session, limits[int(name)], state)
    return Admitted(tuple(started), tuple(impossible), admission.wake_at, frozenset(unlocked))


def _state(session: Session, limit: Row[Any], rows: Sequence[Row[Any]], now: datetime) -> LimitState:
    keys: Mapping[str, int] = {}
    if limit.per_key_slots is not None:
        wanted = {row.key for row in rows if row.limit_id == limit.id}
        keys = {
            key: int(slots)
            for key, slots in session.execute(
                select(LIMIT_HOLDS.c.key, func.sum(LIMIT_HOLDS.c.slots))
                .where(LIMIT_HOLDS.c.limit_id == limit.id, LIMIT_HOLDS.c.key.in_(wanted))
                .group_by(LIMIT_HOLDS.c.key)
            )
        }
    return LimitState(limit.slots, limit.in_use, limit.per_key_slots, keys, _bucket(limit, now))


def _bucket(limit: Row[Any], now: datetime) -> Bucket | None:
    rate = parse_rate(limit.definition.get("rate"))
    if rate is None:
        return None
    # A rate added to a limit starts full; a stored level is kept across a resize.
    if limit.tokens is None or limit.tokens_at is None:
        return Bucket(rate.count, rate.per_s, float(rate.count), now)
    return Bucket(rate.count, rate.per_s, min(float(rate.count), limit.tokens), limit.tokens_at)


def _start(session: Session, rows: list[Row[Any]], now: datetime) -> Holder:
    """A waiter's rows become holds: the waits removed (all of them, or the pass is wrong), the holds made."""
    first = rows[0]
    waits = delete(LIMIT_WAITERS).where(
        LIMIT_WAITERS.c.worker_task_id == first.worker_task_id, LIMIT_WAITERS.c.attempt == first.attempt
    )
    if affected(session, waits) != len(rows):
        raise SlotAccountingError(f"worker task {first.worker_task_id}'s waits changed under their locks")
    session.execute(
        insert(LIMIT_HOLDS),
        [
            {
                "limit_id": row.limit_id,
                "worker_task_id": row.worker_task_id,
                "attempt": row.attempt,
                "execution_id": row.execution_id,
                "step_name": row.step_name,
                "key": row.key,
                "slots": row.slots,
                "since": now,
            }
            for row in rows
        ],
    )
    return _holder(first)


def _store(session: Session, limit: Row[Any], state: LimitState) -> None:
    values: dict[str, Any] = {"in_use": state.in_use}
    if state.bucket is not None:
        values.update(tokens=state.bucket.level, tokens_at=state.bucket.at)
    guarded = (
        update(LIMITS)
        .where(LIMITS.c.id == limit.id, LIMITS.c.in_use == limit.in_use, LIMITS.c.slots >= state.in_use)
        .values(**values)
    )
    if affected(session, guarded) != 1:
        raise SlotAccountingError(f"limit {limit.name!r} changed under its lock, or would hold over its slots")


def _holder(row: Row[Any]) -> Holder:
    return Holder(row.worker_task_id, row.attempt, row.execution_id, row.step_name)
