"""Shared limits stored, changed, deleted and read back with what is held of them.

A resize never pre-empts a holder: a limit made smaller than what is held admits nobody until its
holders have given back enough. Admitting after a resize (a limit made larger) is
:func:`celeryapp.execution.limit_slots.settle`'s, run by the caller in the same transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, insert, select, tuple_, update
from sqlalchemy.orm import Session

from celeryapp.domain.shared_limits import LimitDefinition
from celeryapp.domain.times import iso, parse_time
from celeryapp.errors import InvalidTransition, NotFound
from celeryapp.monitoring.metric_counts import retire_limit
from models.base import utcnow
from models.limit_tables import LIMIT_HOLDS, LIMIT_WAITERS, LIMITS, waiting_by_limit
from models.session import affected

#: Most waiters and keys :func:`limit_detail` lists (the contract's bounds), and most holders, the
#: longest-held first (``in_use`` counts them all): a limit of 10,000 slots is not read whole.
DETAIL_WAITERS = 100
DETAIL_KEYS = 1000
DETAIL_HOLDERS = 1000


@dataclass(frozen=True)
class StoredLimit:
    id: int
    created: bool
    #: Whether the definition changed (a new limit too): what the audit row records.
    changed: bool


def put_limit(
    session: Session, definition: LimitDefinition, *, now: datetime | None = None, expected_version: int | None = None
) -> StoredLimit:
    """Create the limit, or change it to ``definition`` (its holds and waiters are kept).

    ``expected_version``: the version the caller read and changed (0: a limit it found missing).
    A caller that changes some fields of what it read sends the whole definition back: without
    it, two such changes at once would each write the other's fields as they were read, and one
    would be lost. With it, the second is refused (read under the row's lock, after the first
    committed), and its caller reads the limit again."""
    now = now or utcnow()
    stored = definition.to_json()
    row = session.execute(
        select(LIMITS.c.id, LIMITS.c.definition, LIMITS.c.version)
        .where(LIMITS.c.name == definition.name)
        .with_for_update()
    ).first()
    found = 0 if row is None else row.version
    if expected_version is not None and expected_version != found:
        raise InvalidTransition(
            f"limit {definition.name!r} changed meanwhile (version {found}, not the {expected_version} read); "
            "read it again"
        )
    if row is None:
        limit_id = session.scalar(
            insert(LIMITS)
            .values(
                name=definition.name,
                definition=stored,
                slots=definition.slots,
                per_key_slots=definition.per_key_slots,
                in_use=0,
                version=1,
                created_at=now,
                updated_at=now,
            )
            .returning(LIMITS.c.id)
        )
        assert limit_id is not None
        return StoredLimit(limit_id, created=True, changed=True)
    if row.definition == stored:
        return StoredLimit(row.id, created=False, changed=False)
    values: dict[str, Any] = {
        "definition": stored,
        "slots": definition.slots,
        "per_key_slots": definition.per_key_slots,
        "version": row.version + 1,
        "updated_at": now,
    }
    if row.definition.get("rate") != stored["rate"]:
        values.update(tokens=None, tokens_at=None)  # a new rate starts with a full bucket
    guarded = update(LIMITS).where(LIMITS.c.id == row.id, LIMITS.c.version == row.version)
    if affected(session, guarded.values(**values)) != 1:
        raise InvalidTransition(f"limit {definition.name!r} changed meanwhile; apply it again")
    return StoredLimit(row.id, created=False, changed=True)


@dataclass(frozen=True)
class DeletedLimit:
    #: Slots that were held (the holders run on).
    held_slots: int
    #: ``(worker task id, attempt)`` of the attempts that waited for it, oldest first. Every wait of
    #: theirs is removed (one needing this limit and another must not start with the other alone);
    #: the caller fails them.
    dropped_waiters: tuple[tuple[int, int], ...]


def delete_limit(session: Session, name: str, *, force: bool) -> DeletedLimit:
    """Delete the limit; refused while it is held unless ``force``."""
    row = session.execute(select(LIMITS.c.id, LIMITS.c.in_use).where(LIMITS.c.name == name).with_for_update()).first()
    if row is None:
        raise NotFound(f"limit {name!r} does not exist")
    if row.in_use and not force:
        raise InvalidTransition(f"limit {name!r} is held ({row.in_use} slots in use); delete it with force")
    waiting = select(LIMIT_WAITERS.c.worker_task_id, LIMIT_WAITERS.c.attempt).where(LIMIT_WAITERS.c.limit_id == row.id)
    waiters = tuple(
        (worker_task_id, attempt)
        for worker_task_id, attempt in session.execute(waiting.order_by(LIMIT_WAITERS.c.turn, LIMIT_WAITERS.c.id))
    )
    if waiters:
        holder = tuple_(LIMIT_WAITERS.c.worker_task_id, LIMIT_WAITERS.c.attempt)
        session.execute(delete(LIMIT_WAITERS).where(holder.in_(waiting.subquery().select())))
    session.execute(delete(LIMIT_HOLDS).where(LIMIT_HOLDS.c.limit_id == row.id))
    if affected(session, delete(LIMITS).where(LIMITS.c.id == row.id, LIMITS.c.in_use == row.in_use)) != 1:
        raise InvalidTransition(f"limit {name!r} changed meanwhile; delete it again")
    retire_limit(session, name)
    return DeletedLimit(int(row.in_use), waiters)


def limit_summaries(session: Session) -> list[dict[str, Any]]:
    """Every limit, by name: its definition plus ``in_use``, how many wait for it and since when
    the oldest has waited (``oldest_waiting_since``, ``None`` when none waits)."""
    waiting = waiting_by_limit()
    rows = session.execute(
        select(
            LIMITS.c.definition,
            LIMITS.c.version,
            LIMITS.c.in_use,
            func.coalesce(waiting.c.waiting, 0),
            waiting.c.oldest,
        )
        .outerjoin(waiting, waiting.c.limit_id == LIMITS.c.id)
        .order_by(LIMITS.c.name)
    ).all()
    return [
        {**definition, "version": version, "in_use": in_use, "waiting": count, "oldest_waiting_since": _since(oldest)}
        for definition, version, in_use, count, oldest in rows
    ]


def limit_detail(session: Session, name: str) -> dict[str, Any]:
    """The limit with its holders, its first waiters (oldest first) and the slots each key holds."""
    row = session.execute(select(LIMITS).where(LIMITS.c.name == name)).first()
    if row is None:
        raise NotFound(f"limit {name!r} does not exist")
    holds = session.execute(
        select(LIMIT_HOLDS)
        .where(LIMIT_HOLDS.c.limit_id == row.id)
        .order_by(LIMIT_HOLDS.c.since, LIMIT_HOLDS.c.id)
        .limit(DETAIL_HOLDERS)
    ).all()
    waits = session.execute(
        select(LIMIT_WAITERS)
        .where(LIMIT_WAITERS.c.limit_id == row.id)
        .order_by(LIMIT_WAITERS.c.turn, LIMIT_WAITERS.c.id)
        .limit(DETAIL_WAITERS)
    ).all()
    waiting = session.scalar(select(func.count()).where(LIMIT_WAITERS.c.limit_id == row.id))
    # The first entry of an index of its own (limit, enqueued_at): not a read of the whole queue.
    oldest = session.scalar(select(func.min(LIMIT_WAITERS.c.enqueued_at)).where(LIMIT_WAITERS.c.limit_id == row.id))
    keys = session.execute(
        select(LIMIT_HOLDS.c.key, func.sum(LIMIT_HOLDS.c.slots))
        .where(LIMIT_HOLDS.c.limit_id == row.id)
        .group_by(LIMIT_HOLDS.c.key)
        .order_by(LIMIT_HOLDS.c.key)
        .limit(DETAIL_KEYS)
    ).all()
    return {
        **row.definition,
        "version": row.version,
        "in_use": row.in_use,
        "waiting": waiting,
        "oldest_waiting_since": _since(oldest),
        "holders": [_entry(hold, hold.since) for hold in holds],
        "waiters": [_entry(wait, wait.enqueued_at) for wait in waits],
        "keys": {key: int(slots) for key, slots in keys},
    }


def _since(moment: datetime | str | None) -> str | None:
    # An aggregate's time comes back from SQLite as its stored text, not through the column's type.
    if isinstance(moment, str):
        moment = parse_time(moment)
    return None if moment is None else iso(moment)


def _entry(row: Any, since: datetime) -> dict[str, Any]:
    return {
        "execution_id": row.execution_id,
        "step": row.step_name,
        "key": row.key,
        "slots": row.slots,
        "since": iso(since),
    }
