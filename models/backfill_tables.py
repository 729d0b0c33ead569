"""Backfills: runs of past slots started oldest first, a few at a time."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from celeryapp.states import BackfillOrigin, BackfillStatus
from models.base import Base, UTCDateTime, utcnow
from models.tables import NAME_LENGTH, enum_column


class Backfill(Base):
    """One backfill request (or one catch-up's make-up runs) and how far it got.

    The slots are decided once, when it is made, and stored in order; ``started`` counts the ones
    whose run started (or that were passed over), so the next to start is ``slots[started]``.
    """

    __tablename__ = "backfills"
    __table_args__ = (
        # A schedule's backfills, newest first (its page); the running ones (the recovery sweep).
        Index("ix_backfills_schedule_name_id", "schedule_name", "id"),
        Index("ix_backfills_status", "status"),
        # Deleting a schedule sets its backfills' schedule_id to NULL: one index probe, no scan.
        Index("ix_backfills_schedule_id", "schedule_id"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    schedule_id: Mapped[int | None] = mapped_column(ForeignKey("schedules.id", ondelete="SET NULL"), default=None)
    schedule_name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    origin: Mapped[BackfillOrigin] = enum_column(BackfillOrigin, default=BackfillOrigin.REQUEST)
    #: ``missing``, ``failed`` or ``all`` (the request's ``mode``); ``catchup`` for a catch-up.
    mode: Mapped[str] = mapped_column(String(32))
    #: The requested range (start ≤ slot < end); for a catch-up, its first and after its last slot.
    range_start: Mapped[datetime] = mapped_column(UTCDateTime)
    range_end: Mapped[datetime] = mapped_column(UTCDateTime)
    #: The slots to run, oldest first, as ISO 8601 UTC strings.
    slots: Mapped[list[Any]] = mapped_column(JSON)
    #: How many of ``slots`` were started (or passed over): the next is ``slots[started]``.
    started: Mapped[int] = mapped_column(Integer, default=0)
    max_concurrent: Mapped[int] = mapped_column(Integer, default=1)
    #: No slot starts before this (a slot its business calendar moved to the next business day
    #: waits for that day's wall time); None: at once.
    not_before: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    status: Mapped[BackfillStatus] = enum_column(BackfillStatus, default=BackfillStatus.RUNNING)
    #: Identifies the request (schedule, range, mode): asked again, it starts nothing.
    request_key: Mapped[str | None] = mapped_column(String(400), unique=True, default=None)
    #: The definition version its runs run (named by the request); None: the current one at each start.
    version: Mapped[int | None] = mapped_column(Integer, default=None)
    actor: Mapped[str | None] = mapped_column(String(100), default=None)
    reason: Mapped[str | None] = mapped_column(String(500), default=None)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
