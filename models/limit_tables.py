"""Shared limits: each limit with what is held of it, the holds, and the waiters (docs/limits.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from sqlalchemy import JSON, Float, ForeignKey, Index, Integer, String, Subquery, Table, UniqueConstraint, func, select
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, UTCDateTime, utcnow
from models.tables import NAME_LENGTH

#: A rendered key (celeryapp/domain/shared_limits.py's ``MAX_KEY_CHARS``).
KEY_LENGTH = 200
#: A waiter's queue: a digest of the limits and keys it needs (hex).
QUEUE_LENGTH = 40


class Limit(Base):
    """A named limit. ``in_use`` is the sum of its holds' slots, changed with them in one transaction
    under this row's lock (and checked against ``slots`` by every change): reading it is one row."""

    __tablename__ = "limits"
    __table_args__ = ({"sqlite_autoincrement": True},)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LENGTH), unique=True)
    #: The definition as validated (its ``to_json``); ``slots`` and ``per_key_slots`` are also
    #: columns, for the statements that guard them.
    definition: Mapped[dict[str, Any]] = mapped_column(JSON)
    slots: Mapped[int] = mapped_column(Integer)
    per_key_slots: Mapped[int | None] = mapped_column(Integer, default=None)
    in_use: Mapped[int] = mapped_column(Integer, default=0)
    #: The rate's token bucket: its level at ``tokens_at`` (reference clock); None without a rate.
    tokens: Mapped[float | None] = mapped_column(Float, default=None)
    tokens_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    version: Mapped[int] = mapped_column(Integer, default=1)
    #: The schedule file source that declared the limit (applying that file again may delete it);
    #: ``None``: defined through the service tasks or the CLI, no file removes it.
    source_name: Mapped[str | None] = mapped_column(String(NAME_LENGTH), default=None)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class LimitHold(Base):
    """Slots of one limit held by one attempt of one step (a worker task and its attempt number:
    an older attempt, fenced off, can never release its successor's)."""

    __tablename__ = "limit_holds"
    __table_args__ = (
        # A holder's holds (its release), and one hold per limit per attempt.
        UniqueConstraint("worker_task_id", "attempt", "limit_id"),
        # The slots each key of a limit holds; a limit's holders, longest-held first.
        Index("ix_limit_holds_limit_id_key", "limit_id", "key"),
        Index("ix_limit_holds_limit_id_since", "limit_id", "since"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    limit_id: Mapped[int] = mapped_column(ForeignKey("limits.id", ondelete="CASCADE"))
    #: No foreign key: a hold is released by the transaction that ends the attempt, which may
    #: delete the worker task in the same breath; the release must find the hold, not a cascade.
    worker_task_id: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer)
    execution_id: Mapped[int] = mapped_column(Integer)
    step_name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    key: Mapped[str] = mapped_column(String(KEY_LENGTH), default="")
    slots: Mapped[int] = mapped_column(Integer, default=1)
    since: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class LimitWaiter(Base):
    """One limit a waiting attempt needs; a waiter needing three limits is three rows, admitted
    together. ``turn`` and ``id`` order the waiters (celeryapp/domain/limit_admission.py)."""

    __tablename__ = "limit_waiters"
    __table_args__ = (
        UniqueConstraint("worker_task_id", "attempt", "limit_id"),
        # A limit's waiters in the order they are served, oldest turn first.
        Index("ix_limit_waiters_limit_id_turn_id", "limit_id", "turn", "id"),
        # The last turn of a queue (a new waiter's turn follows it).
        Index("ix_limit_waiters_queue_turn", "queue", "turn"),
        # A limit's oldest waiter (its age on the Limits page and in the metrics): the index's first entry.
        Index("ix_limit_waiters_limit_id_enqueued_at", "limit_id", "enqueued_at"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    limit_id: Mapped[int] = mapped_column(ForeignKey("limits.id", ondelete="CASCADE"))
    worker_task_id: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer)
    execution_id: Mapped[int] = mapped_column(Integer)
    step_name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    key: Mapped[str] = mapped_column(String(KEY_LENGTH), default="")
    slots: Mapped[int] = mapped_column(Integer, default=1)
    #: How many limits the waiter needs (its rows): only a waiter needing more than one has rows
    #: outside the limit a pass reads, looked up by its worker task and attempt.
    needs: Mapped[int] = mapped_column(Integer, default=1)
    queue: Mapped[str] = mapped_column(String(QUEUE_LENGTH))
    turn: Mapped[int] = mapped_column(Integer)
    enqueued_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


LIMITS = cast(Table, Limit.__table__)
LIMIT_HOLDS = cast(Table, LimitHold.__table__)
LIMIT_WAITERS = cast(Table, LimitWaiter.__table__)


def waiting_by_limit() -> Subquery:
    """Per limit with waiters: ``limit_id``, how many wait (``waiting``) and the oldest arrival
    (``oldest``; SQLite gives an aggregate's time back as its stored text). One grouped read of
    the waiters, the first entries of the (limit_id, enqueued_at) index."""
    return (
        select(
            LIMIT_WAITERS.c.limit_id,
            func.count().label("waiting"),
            func.min(LIMIT_WAITERS.c.enqueued_at).label("oldest"),
        )
        .group_by(LIMIT_WAITERS.c.limit_id)
        .subquery()
    )
