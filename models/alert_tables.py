"""The alert outbox: alerts decided with the fact they report, their deliveries, and silences."""

from __future__ import annotations

from datetime import datetime
from typing import cast

from sqlalchemy import ForeignKey, Index, Integer, String, Table, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from celeryapp.states import AlertKind, DeliveryStatus
from models.base import Base, UTCDateTime, utcnow
from models.tables import NAME_LENGTH, enum_column

#: Length of an alert's stable id (its de-duplication key, readable: kind, schedule, slot).
ALERT_KEY_LENGTH = 400
#: Length of a channel's name (the channels file refuses longer names).
CHANNEL_NAME_LENGTH = 32


class Alert(Base):
    """One alert, written in the transaction that records the fact it reports (a run failing, a
    slot recorded missed, a deadline passing): a crash between deciding and sending loses nothing,
    and the unique ``key`` makes it once per (schedule, slot, kind) whoever decides it first."""

    __tablename__ = "alerts"
    __table_args__ = (
        # A schedule's alerts, newest first (its page and badge).
        Index("ix_alerts_schedule_name_id", "schedule_name", "id"),
        # Housekeeping by age; the alerts page's open ones.
        Index("ix_alerts_at", "at"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    #: The stable id receivers de-duplicate on, e.g. ``late/finish/nightly-hr-sync/2026-11-24T02:00:00Z``.
    key: Mapped[str] = mapped_column(String(ALERT_KEY_LENGTH), unique=True)
    kind: Mapped[AlertKind] = enum_column(AlertKind)
    #: What kind of ``late`` or ``missed`` it is (``predicted``, ``start``, ``finish``,
    #: ``skipped_overlap``, ``not_fired``...); None for the others.
    detail: Mapped[str | None] = mapped_column(String(32), default=None)
    schedule_name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    #: The nominal time of the slot it is about; None for a manual run's failure and a test.
    slot_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    execution_id: Mapped[int | None] = mapped_column(Integer, default=None)
    message: Mapped[str] = mapped_column(Text)
    #: When it was decided, by the reference clock.
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    #: A predicted ``late``: when the run is expected to finish.
    expected_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    #: Decided while the schedule was silenced: kept and shown, never sent.
    silenced: Mapped[bool] = mapped_column(default=False)
    acknowledged_by: Mapped[str | None] = mapped_column(String(100), default=None)
    acknowledged_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)


class AlertDelivery(Base):
    """One alert to one channel: retried with backoff until delivered or given up."""

    __tablename__ = "alert_deliveries"
    __table_args__ = (
        UniqueConstraint("alert_id", "channel"),
        # The sender's question: which pending deliveries are due.
        Index("ix_alert_deliveries_status_next_try_at", "status", "next_try_at"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    alert_id: Mapped[int] = mapped_column(ForeignKey("alerts.id", ondelete="CASCADE"))
    channel: Mapped[str] = mapped_column(String(CHANNEL_NAME_LENGTH))
    status: Mapped[DeliveryStatus] = enum_column(DeliveryStatus, default=DeliveryStatus.PENDING)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_try_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    #: A sender working on it holds it until then (compare-and-set); a sender that died releases
    #: it by letting the time pass.
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    last_error: Mapped[str | None] = mapped_column(Text, default=None)
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)


class AlertSilence(Base):
    """No alert of a schedule is sent until ``until``; alerts decided meanwhile are kept, marked."""

    __tablename__ = "alert_silences"
    __table_args__ = (
        Index("ix_alert_silences_schedule_name_until", "schedule_name", "until"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    schedule_name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    until: Mapped[datetime] = mapped_column(UTCDateTime)
    actor: Mapped[str] = mapped_column(String(100))
    reason: Mapped[str | None] = mapped_column(String(500), default=None)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


ALERTS = cast(Table, Alert.__table__)
ALERT_DELIVERIES = cast(Table, AlertDelivery.__table__)
ALERT_SILENCES = cast(Table, AlertSilence.__table__)
