"""Alerts written to the outbox in the transaction of the fact they report.

A run failing, a schedule going dead, a slot recorded missed, a deadline passing: each writes its
alert (and one pending delivery per channel) beside the fact, so a crash between deciding and
sending loses nothing and a fact rolled back raises nothing. The alert's ``key`` is unique: the
same (schedule, slot, kind) decided twice, by two workers or by a retried transaction, is written
once. Sending is the alert sender's (:mod:`celeryapp.alerting.sender`), off every step and control path.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import and_, insert, or_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from celeryapp.domain.times import iso
from celeryapp.monitoring import metric_counts
from models import AlertKind, DeliveryStatus, ExecutionStatus, Schedule, ScheduleExecution, SlotOutcome
from models.alert_tables import ALERT_DELIVERIES, ALERT_SILENCES, ALERTS
from models.tables import SLOT_RECORDS

logger = logging.getLogger(__name__)

#: Slot outcomes that mean "a slot that should have produced a run did not" (a paused
#: schedule's slots are not among them: somebody chose that).
MISSED_OUTCOMES = frozenset({SlotOutcome.SKIPPED_OVERLAP, SlotOutcome.SKIPPED_SUPERSEDED, SlotOutcome.MISSED})
#: Longest message kept; a huge error is cut here (and again by each channel to what it carries).
MESSAGE_CHARS = 4000
#: What an alert kind needs in ``alerts.on`` to be sent (``resolved`` follows ``late``).
_ENABLED_BY = {AlertKind.RESOLVED: AlertKind.LATE}


def alert_key(
    kind: AlertKind,
    schedule_name: str,
    *,
    slot_at: datetime | None = None,
    execution_id: int | None = None,
    detail: str | None = None,
) -> str:
    """The stable id of an alert: what it is about, readable. One slot has at most one alert of
    each kind (``late`` one of each detail: predicted, start, finish); an alert about no slot (a
    manual run, a schedule going dead) is one per run."""
    about = iso(slot_at) if slot_at is not None else f"execution-{execution_id}"
    parts = [kind.value, detail if kind is AlertKind.LATE else None, schedule_name, about]
    return "/".join(part for part in parts if part)


def write_alert(
    session: Session,
    *,
    key: str,
    kind: AlertKind,
    schedule_name: str,
    message: str,
    channels: Iterable[str],
    now: datetime,
    slot_at: datetime | None = None,
    execution_id: int | None = None,
    detail: str | None = None,
    expected_at: datetime | None = None,
    silenced: bool = False,
) -> int | None:
    """Write one alert and its pending deliveries; ``None`` if an alert with ``key`` exists."""
    values: dict[str, Any] = {
        "key": key,
        "kind": kind.value,
        "detail": detail,
        "schedule_name": schedule_name,
        "slot_at": slot_at,
        "execution_id": execution_id,
        "message": message[:MESSAGE_CHARS],
        "at": now,
        "expected_at": expected_at,
        "silenced": silenced,
    }
    connection = session.connection()
    statement = _INSERTS[connection.dialect.name == "postgresql"]
    alert_id = connection.execute(statement, values).scalar()
    if alert_id is None:
        return None  # decided before, by this process or another
    rows = [
        {"alert_id": alert_id, "channel": c, "status": DeliveryStatus.PENDING.value, "attempts": 0, "next_try_at": now}
        for c in dict.fromkeys(channels)
    ]
    if rows and not silenced:
        connection.execute(insert(ALERT_DELIVERIES), rows)
    counts = metric_counts.Counts()
    counts.count(metric_counts.ALERTS, "", kind.value)
    counts.add_to(session)
    logger.warning("alert %s: %s", key, message[:200])
    return int(alert_id)


def raise_alert(
    session: Session,
    *,
    schedule_name: str,
    kind: AlertKind,
    message: str,
    now: datetime,
    slot_at: datetime | None = None,
    execution_id: int | None = None,
    detail: str | None = None,
    expected_at: datetime | None = None,
    config: dict[str, Any] | None = None,
) -> int | None:
    """Write the alert if the schedule's ``alerts.on`` asks for its kind; its id, or ``None`` when
    not asked for or already raised. ``config``: the schedule's ``alerts`` object when the caller
    has it (read here otherwise)."""
    if config is None:
        config = session.execute(select(Schedule.alerts).where(Schedule.name == schedule_name)).scalar()
    if not config or _ENABLED_BY.get(kind, kind).value not in config.get("on", ()):
        return None
    return write_alert(
        session,
        key=alert_key(kind, schedule_name, slot_at=slot_at, execution_id=execution_id, detail=detail),
        kind=kind,
        schedule_name=schedule_name,
        message=message,
        channels=config.get("channels", ()),
        now=now,
        slot_at=slot_at,
        execution_id=execution_id,
        detail=detail,
        expected_at=expected_at,
        silenced=is_silenced(session, schedule_name, now),
    )


def is_silenced(session: Session, schedule_name: str, now: datetime) -> bool:
    silence = (
        select(ALERT_SILENCES.c.id)
        .where(ALERT_SILENCES.c.schedule_name == schedule_name, ALERT_SILENCES.c.until > now)
        .limit(1)
    )
    return session.execute(silence).first() is not None


def slot_of(session: Session, execution_id: int) -> datetime | None:
    """The nominal slot a run was fired for (None for a manual run)."""
    found = select(SLOT_RECORDS.c.nominal_at).where(SLOT_RECORDS.c.execution_id == execution_id).limit(1)
    return session.execute(found).scalar()


def alert_run_ended(
    session: Session,
    execution: ScheduleExecution,
    status: ExecutionStatus,
    *,
    error: str | None,
    now: datetime,
    config: dict[str, Any] | None,
) -> None:
    """A run ended: ``failed`` if it failed, ``resolved`` if it had been reported late. In the
    transaction that ends it (the schedule's row lock is held); ``config`` is the schedule's
    ``alerts`` object, read with the schedule's counters."""
    if not config:
        return
    name, run = execution.schedule_name, execution.id
    slot = slot_of(session, run)
    common: dict[str, Any] = {"schedule_name": name, "now": now, "slot_at": slot, "execution_id": run, "config": config}
    if status is ExecutionStatus.FAILED:
        raise_alert(session, kind=AlertKind.FAILED, message=f"{name}: run {run} failed: {error}", **common)
    about = ALERTS.c.execution_id == run
    if slot is not None:
        about = or_(about, ALERTS.c.slot_at == slot)
    late = select(ALERTS.c.id).where(and_(ALERTS.c.schedule_name == name, ALERTS.c.kind == AlertKind.LATE.value, about))
    if session.execute(late.limit(1)).first() is not None:
        ended = f"{name}: run {run} ended {status.value} at {iso(now, timespec='seconds')}"
        raise_alert(session, kind=AlertKind.RESOLVED, message=ended, **common)


def alert_missed_slots(
    session: Session,
    slots: Iterable[tuple[str, SlotOutcome, datetime | None, str | None, dict[str, Any] | None]],
    *,
    now: datetime,
) -> None:
    """``missed`` for each recorded slot that should have produced a run and did not:
    (schedule name, outcome, nominal time, the record's detail, the schedule's ``alerts`` object)."""
    for name, outcome, nominal_at, detail, config in slots:
        if outcome not in MISSED_OUTCOMES:
            continue
        what = outcome.value.replace("_", " ")
        when = iso(nominal_at, timespec="seconds") or "a slot"
        message = f"{name}: the slot of {when} produced no run ({what})" + (f": {detail}" if detail else "")
        raise_alert(
            session,
            schedule_name=name,
            kind=AlertKind.MISSED,
            message=message,
            now=now,
            slot_at=nominal_at,
            detail=outcome.value,
            config=config or {},
        )


def _insert(dialect: Any) -> Any:
    return dialect.insert(ALERTS).on_conflict_do_nothing(index_elements=["key"]).returning(ALERTS.c.id)


#: By "is it PostgreSQL" (else SQLite, whose upsert has the same form).
_INSERTS = {True: _insert(postgresql), False: _insert(sqlite)}
