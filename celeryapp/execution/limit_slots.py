"""Slots of shared limits taken and given back in the caller's transaction, never over a limit.

Every change locks the limit rows it touches first, in one order for all (by id, ``FOR UPDATE``;
SQLite's writer lock covers them all), so two transactions never wait for each other in a circle.
What is held is then read again under the locks, and every change is a guarded statement whose
count of rows is checked: a hold whose release already ran is not found again, and ``in_use``
never passes ``slots`` nor goes below zero.

A step whose limits all have room and no waiter takes its holds directly, in four statements
(:func:`_take_at_once`); a release finds out, in the statement giving the slots back, whether
anyone waits, and runs no pass when nobody does (four statements too).

A release admits the next waiters in the same transaction (:mod:`celeryapp.domain.limit_admission`
decides which): no waiter polls. The caller sends the admitted steps' messages after commit.
Times come from the reference clock. docs/limits.md says what a crash costs.
"""

from __future__ import annotations

import functools
import hashlib
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    CursorResult,
    Integer,
    Row,
    String,
    Table,
    bindparam,
    delete,
    exists,
    func,
    insert,
    literal,
    select,
    tuple_,
    union_all,
    update,
)
from sqlalchemy.orm import Session

from celeryapp.domain.limit_admission import Bucket, LimitState, Need, Waiter, admit, turn_of
from celeryapp.domain.shared_limits import MAX_KEY_CHARS, MAX_SLOTS, MAX_USES, parse_rate
from celeryapp.errors import ChordbeatError, InvalidArgument, NotFound
from celeryapp.monitoring.metric_counts import observe_admissions
from models.base import UTCDateTime, utcnow
from models.limit_tables import LIMIT_HOLDS, LIMIT_WAITERS, LIMITS

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
    them. ``wake_at``: run :func:`settle` on ``decided`` then (a rate's next token). ``recheck``:
    limits to :func:`settle` because a waiter needing them arrived while this pass held others' locks."""

    started: tuple[Holder, ...] = ()
    impossible: tuple[Holder, ...] = ()
    wake_at: datetime | None = None
    recheck: frozenset[int] = frozenset()
    #: The limits the pass decided on (those it locked).
    decided: frozenset[int] = frozenset()


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
    # The demanded limits locked first, by id, in one statement (the one order): what they hold
    # is read under the lock, so the path taken below is decided on what no one else can change.
    rows = session.execute(_LOCK_NAMED, {"p_names": [demand.limit for demand in demands]}).all()
    limits: dict[str, Any] = {row.name: row for row in rows}
    missing = [demand.limit for demand in demands if demand.limit not in limits]
    if missing:
        raise NotFound(f"limit {missing[0]!r} does not exist")
    if _take_at_once(session, demands, limits, holder, now):
        return True, Admitted()
    return _acquire_in_turn(session, demands, {name: row.id for name, row in limits.items()}, holder, now)


def _take_at_once(
    session: Session, demands: Sequence[Demand], limits: Mapping[str, Any], holder: Holder, now: datetime
) -> bool:
    """The path of a step whose limits all have room and no waiter: its holds made at once, in
    one statement, then the counts (no wait written, read back and turned into a hold).

    The same decision as a pass over the one newcomer would make: taken only when nobody waits
    for any of the limits (one who did might be owed the slot or the token first), when every
    limit has the slots, the key its ``per_key_slots`` and the rate a token. The conditions on
    other rows (waiters, the key's holds, this attempt's own hold or wait: a redelivery) are
    the insert's own ``WHERE``, read after the locks were taken. False: nothing was written;
    the caller takes the waiter's path, which decides the rest.
    """
    states: dict[str, LimitState] = {}
    for demand in demands:
        row = limits[demand.limit]
        state = LimitState(row.slots, row.in_use, row.per_key_slots, {}, _bucket(row, now))
        if state.in_use + demand.slots > state.slots or (state.bucket is not None and state.bucket.level_at(now) < 1.0):
            return False
        states[demand.limit] = state.hold(demand.key, demand.slots, now)
    params: dict[str, Any] = {
        "p_worker_task_id": holder.worker_task_id,
        "p_attempt": holder.attempt,
        "p_execution_id": holder.execution_id,
        "p_step_name": holder.step_name,
        "p_since": now,
    }
    for index, demand in enumerate(demands):
        limit = limits[demand.limit]
        params.update({f"p_limit_{index}": limit.id, f"p_key_{index}": demand.key, f"p_slots_{index}": demand.slots})
        if limit.per_key_slots is not None:
            params[f"p_per_key_{index}"] = limit.per_key_slots
    made = _holds_made(tuple(limits[demand.limit].per_key_slots is not None for demand in demands))
    # Counted by RETURNING: an INSERT ... SELECT's rowcount is not told on every driver (-1).
    inserted = len(session.execute(made, params).all())
    if not inserted:
        return False
    if inserted != len(demands):
        raise SlotAccountingError(f"worker task {holder.worker_task_id}'s holds were made in part")
    for demand in demands:
        _store(session, limits[demand.limit], states[demand.limit])
    observe_admissions(session, [(demand.limit, 0.0) for demand in demands])
    return True


@functools.cache
def _holds_made(keyed: tuple[bool, ...]) -> Any:
    """The holds of one attempt, one per demanded limit (``keyed``: whether each has
    ``per_key_slots``), made only when nobody waits for any of the limits, the attempt neither
    holds nor waits already, and each key has room: one statement, its conditions read together.
    Built once per shape, with parameters (building and compiling it costs more than running it)."""
    unheld = [
        ~exists().where(*_of_attempt(LIMIT_HOLDS)),
        ~exists().where(*_of_attempt(LIMIT_WAITERS)),
    ]
    for index, has_key in enumerate(keyed):
        unheld.append(_first_waiter_of(bindparam(f"p_limit_{index}")).is_(None))
        if has_key:
            key_held = (
                select(func.coalesce(func.sum(LIMIT_HOLDS.c.slots), 0))
                .where(
                    LIMIT_HOLDS.c.limit_id == bindparam(f"p_limit_{index}"),
                    LIMIT_HOLDS.c.key == bindparam(f"p_key_{index}"),
                )
                .scalar_subquery()
            )
            unheld.append(key_held + bindparam(f"p_slots_{index}", type_=Integer) <= bindparam(f"p_per_key_{index}"))
    holds = [
        select(
            bindparam(f"p_limit_{index}", type_=Integer),
            bindparam("p_worker_task_id", type_=Integer),
            bindparam("p_attempt", type_=Integer),
            bindparam("p_execution_id", type_=Integer),
            bindparam("p_step_name", type_=String),
            bindparam(f"p_key_{index}", type_=String),
            bindparam(f"p_slots_{index}", type_=Integer),
            bindparam("p_since", type_=UTCDateTime),
        ).where(*unheld)
        for index in range(len(keyed))
    ]
    rows = holds[0] if len(holds) == 1 else union_all(*holds)
    return insert(LIMIT_HOLDS).from_select(_HOLD_COLUMNS, rows).returning(LIMIT_HOLDS.c.id)


def _of_attempt(table: Table) -> tuple[Any, ...]:
    return (
        table.c.worker_task_id == bindparam("p_worker_task_id"),
        table.c.attempt == bindparam("p_attempt"),
    )


def _acquire_in_turn(
    session: Session, demands: Sequence[Demand], ids: Mapping[str, int], holder: Holder, now: datetime
) -> tuple[bool, Admitted]:
    """The waiter's path: a wait written with its turn, then a pass over the limits' waiters."""
    held = set(ids.values())
    # The limits the first waiters also need are locked too, to admit them, but only those after
    # the ones held (the one order); a pass sees the others as full (its answer's ``recheck``).
    later = {limit_id for limit_id in _co_needed(session, held) if limit_id > max(held)}
    locked = held | (_lock(session, later) if later else set())
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
    held_now = holder in admitted.started
    if holder in admitted.impossible:
        raise InvalidArgument("uses", f"asks for more slots than {', '.join(sorted(ids))} can ever give")
    others = tuple(h for h in admitted.started if h != holder)
    return held_now, Admitted(others, admitted.impossible, admitted.wake_at, admitted.recheck, admitted.decided)


def release(session: Session, worker_task_id: int, attempt: int, *, now: datetime | None = None) -> Released:
    """Give back every slot this attempt holds and drop its waits, then admit the next waiters.

    Exactly this attempt's: an older attempt (fenced off) releases nothing of its successor's, and
    a release run twice gives back nothing the second time.
    """
    now = now or utcnow()
    attempt_of = {"p_worker_task_id": worker_task_id, "p_attempt": attempt}
    found = session.execute(_RELEASE_SEED, attempt_of).all()
    if not found:
        return Released(0, Admitted())
    ids = {row.limit_id for row in found}
    locked = _lock(session, ids | (_co_needed(session, ids) if any(row.waited is not None for row in found) else set()))
    # Under the locks: a release that ran meanwhile left nothing to find, so nothing is given twice.
    given: dict[int, int] = defaultdict(int)
    for limit_id, slots in session.execute(_HOLDS_DELETED, attempt_of):
        given[limit_id] += slots
    if not set(given) <= locked:
        raise SlotAccountingError(f"worker task {worker_task_id} attempt {attempt} held limits it was not seen to hold")
    # Whether anyone waits is read under the locks, as each limit is given back: no waiter, no pass.
    waiting = locked != set(given) or any(not row.held for row in found)
    for limit_id, slots in sorted(given.items()):
        given_back = session.execute(_GIVEN_BACK, {"p_limit_id": limit_id, "p_slots": slots}).first()
        if given_back is None:
            raise SlotAccountingError(f"limit {limit_id} holds fewer than the {slots} slots released")
        waiting = waiting or given_back.waited is not None
    if any(not row.held for row in found):
        session.execute(delete(LIMIT_WAITERS).where(*_of_attempt(LIMIT_WAITERS)), attempt_of)
    return Released(sum(given.values()), _decide(session, locked, now) if waiting else Admitted())


def _first_waiter_of(limit_id: Any) -> Any:
    """The id of a limit's first waiter, NULL when none waits: the first entry of its index in
    serving order (an EXISTS is planned as a scan of every limit's waiters when they are many)."""
    return (
        select(LIMIT_WAITERS.c.id)
        .where(LIMIT_WAITERS.c.limit_id == limit_id)
        .order_by(LIMIT_WAITERS.c.turn, LIMIT_WAITERS.c.id)
        .limit(1)
        .scalar_subquery()
    )


def _release_seed() -> Any:
    """The limits an attempt holds (``held``) or waits for, each with whether anyone waits for it:
    one read, unlocked (it only says which limits to lock, and whether to look for co-needed ones)."""
    seed = union_all(
        select(LIMIT_HOLDS.c.limit_id, literal(1, Integer).label("held")).where(*_of_attempt(LIMIT_HOLDS)),
        select(LIMIT_WAITERS.c.limit_id, literal(0, Integer).label("held")).where(*_of_attempt(LIMIT_WAITERS)),
    ).subquery()
    return select(seed.c.limit_id, seed.c.held, _first_waiter_of(seed.c.limit_id).label("waited"))


_RELEASE_SEED = _release_seed()
_HOLDS_DELETED = (
    delete(LIMIT_HOLDS).where(*_of_attempt(LIMIT_HOLDS)).returning(LIMIT_HOLDS.c.limit_id, LIMIT_HOLDS.c.slots)
)
#: Slots given back, guarded (never below zero), with whether anyone waits for the limit: read in
#: the same statement, under the limit's lock.
_GIVEN_BACK = (
    update(LIMITS)
    .where(LIMITS.c.id == bindparam("p_limit_id"), LIMITS.c.in_use >= bindparam("p_slots"))
    .values(in_use=LIMITS.c.in_use - bindparam("p_slots"))
    # The limit by its parameter, not correlated: SQLite's RETURNING names columns unqualified.
    .returning(_first_waiter_of(bindparam("p_limit_id")).label("waited"))
)


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


def _co_needed(session: Session, limit_ids: Collection[int]) -> set[int]:
    """The limits the first waiters of ``limit_ids`` also need: a pass locks them too, to admit them."""
    first = session.execute(_FIRST_NEEDS, {"p_ids": sorted(limit_ids)}).all()
    others = [(row.worker_task_id, row.attempt) for row in first if row.needs > 1]
    found = {row.limit_id for row in first}
    if others:
        found |= set(session.scalars(select(LIMIT_WAITERS.c.limit_id).where(_holder_in(others)).distinct()))
    return found


def _first_waiters(*columns: Any) -> Any:
    """The first waiter rows of the limits ``p_ids`` in the order they are served (one index range each)."""
    return (
        select(LIMIT_WAITERS.c.worker_task_id, LIMIT_WAITERS.c.attempt, *columns)
        .where(LIMIT_WAITERS.c.limit_id.in_(bindparam("p_ids", expanding=True)))
        .order_by(LIMIT_WAITERS.c.turn, LIMIT_WAITERS.c.id)
        .limit(PASS_WAITERS)
    )


# A pass's reads and writes, built once (as the locks): every admission runs them.
_FIRST_NEEDS = _first_waiters(LIMIT_WAITERS.c.limit_id, LIMIT_WAITERS.c.needs)
_FIRST_ROWS = _first_waiters(*LIMIT_WAITERS.c)
_LIMIT_ROWS = select(LIMITS).where(LIMITS.c.id.in_(bindparam("p_ids", expanding=True)))
_KEYS_HELD = (
    select(LIMIT_HOLDS.c.key, func.sum(LIMIT_HOLDS.c.slots))
    .where(LIMIT_HOLDS.c.limit_id == bindparam("p_id"), LIMIT_HOLDS.c.key.in_(bindparam("p_keys", expanding=True)))
    .group_by(LIMIT_HOLDS.c.key)
)
_WAITS_ENDED = delete(LIMIT_WAITERS).where(*_of_attempt(LIMIT_WAITERS))


def _holder_in(holders: Sequence[tuple[int, int]]) -> Any:
    """Rows of these (worker task, attempt) pairs, given as values: probes of the unique index."""
    return tuple_(LIMIT_WAITERS.c.worker_task_id, LIMIT_WAITERS.c.attempt).in_(holders)


#: A limit's columns a pass and the uncontended path read (its definition for the rate).
_LIMIT_COLUMNS = (
    LIMITS.c.id,
    LIMITS.c.name,
    LIMITS.c.definition,
    LIMITS.c.slots,
    LIMITS.c.per_key_slots,
    LIMITS.c.in_use,
    LIMITS.c.tokens,
    LIMITS.c.tokens_at,
)
_HOLD_COLUMNS = ["limit_id", "worker_task_id", "attempt", "execution_id", "step_name", "key", "slots", "since"]


def _lock(session: Session, limit_ids: set[int]) -> set[int]:
    """Lock the limits, by id, in one statement: the one order every transaction takes them in."""
    return set(session.scalars(_LOCK_IDS, {"p_ids": sorted(limit_ids)}))


# Built once, with parameters: building a statement and its cache key costs more than running it.
_LOCK_IDS = (
    select(LIMITS.c.id)
    .where(LIMITS.c.id.in_(bindparam("p_ids", expanding=True)))
    .order_by(LIMITS.c.id)
    .with_for_update()
)
_LOCK_NAMED = (
    select(*_LIMIT_COLUMNS)
    .where(LIMITS.c.name.in_(bindparam("p_names", expanding=True)))
    .order_by(LIMITS.c.id)
    .with_for_update()
)


def _decide(session: Session, locked: set[int], now: datetime) -> Admitted:
    first = session.execute(_FIRST_ROWS, {"p_ids": sorted(locked)}).all()
    if not first:
        return Admitted()
    others = sorted({(row.worker_task_id, row.attempt) for row in first if row.needs > 1})
    more = session.execute(select(LIMIT_WAITERS).where(_holder_in(others))).all() if others else []
    rows = list({row.id: row for row in [*first, *more]}.values())
    limits = {row.id: row for row in session.execute(_LIMIT_ROWS, {"p_ids": sorted(locked)}).all()}
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
    return Admitted(tuple(started), tuple(impossible), admission.wake_at, frozenset(unlocked), frozenset(locked))


def _state(session: Session, limit: Row[Any], rows: Sequence[Row[Any]], now: datetime) -> LimitState:
    keys: Mapping[str, int] = {}
    if limit.per_key_slots is not None:
        wanted = {row.key for row in rows if row.limit_id == limit.id}
        keys = {
            key: int(slots) for key, slots in session.execute(_KEYS_HELD, {"p_id": limit.id, "p_keys": sorted(wanted)})
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
    attempt_of = {"p_worker_task_id": first.worker_task_id, "p_attempt": first.attempt}
    if int(cast(CursorResult[Any], session.execute(_WAITS_ENDED, attempt_of)).rowcount) != len(rows):
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
    params: dict[str, Any] = {"p_id": limit.id, "p_was": limit.in_use, "p_in_use": state.in_use}
    if state.bucket is not None:
        params.update(p_tokens=state.bucket.level, p_tokens_at=state.bucket.at)
    guarded = _STORED[state.bucket is not None]
    if int(cast(CursorResult[Any], session.execute(guarded, params)).rowcount) != 1:
        raise SlotAccountingError(f"limit {limit.name!r} changed under its lock, or would hold over its slots")


def _stored(bucket: bool) -> Any:
    """A limit's count (and its bucket) changed, guarded: the count it was read with, never over its slots."""
    values: dict[str, Any] = {"in_use": bindparam("p_in_use")}
    if bucket:
        values.update(tokens=bindparam("p_tokens"), tokens_at=bindparam("p_tokens_at"))
    return (
        update(LIMITS)
        .where(
            LIMITS.c.id == bindparam("p_id"),
            LIMITS.c.in_use == bindparam("p_was"),
            LIMITS.c.slots >= bindparam("p_in_use"),
        )
        .values(**values)
    )


#: By whether the limit has a rate.
_STORED = {False: _stored(False), True: _stored(True)}


def _holder(row: Row[Any]) -> Holder:
    return Holder(row.worker_task_id, row.attempt, row.execution_id, row.step_name)
