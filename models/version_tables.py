"""Definition versions: every definition a schedule had, immutable (docs/versions.md)."""

from __future__ import annotations

from datetime import datetime
from typing import cast

from sqlalchemy import ForeignKey, Integer, String, Table, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, UTCDateTime, utcnow
from models.tables import NAME_LENGTH

#: A hex SHA-256.
HASH_LENGTH = 64
#: A commit id as ``git rev-parse`` prints it (SHA-1 or SHA-256, maybe marked ``-dirty``), or
#: what an operator gave.
COMMIT_LENGTH = 80
#: A schedule file's name as given (cut to it).
FILE_LENGTH = 500


class ScheduleVersion(Base):
    """Version ``version`` of a schedule's definition: its canonical JSON text and that text's hash,
    and who made it, from where and why. Written in the transaction that changes the definition;
    never changed. Kept when its schedule is deleted (``schedule_id`` then null), as its runs are,
    until housekeeping finds it past retention with no kept run of it."""

    __tablename__ = "schedule_versions"
    # A schedule's versions, newest first, and one version: the unique constraint's index.
    __table_args__ = (UniqueConstraint("schedule_id", "version"), {"sqlite_autoincrement": True})

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    schedule_id: Mapped[int | None] = mapped_column(ForeignKey("schedules.id", ondelete="SET NULL"))
    schedule_name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    version: Mapped[int] = mapped_column(Integer)
    definition: Mapped[str] = mapped_column(Text)
    hash: Mapped[str] = mapped_column(String(HASH_LENGTH))
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    actor: Mapped[str] = mapped_column(String(100))
    #: Where the change came from: service, cli, web or beat (an audit row's source).
    source: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str | None] = mapped_column(String(500), default=None)
    file: Mapped[str | None] = mapped_column(String(FILE_LENGTH), default=None)
    commit: Mapped[str | None] = mapped_column(String(COMMIT_LENGTH), default=None)


SCHEDULE_VERSIONS = cast(Table, ScheduleVersion.__table__)
