"""Slots beat moved past whose fire message never reached a worker, found and fired again."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import redis
from redbeat.schedulers import ensure_conf
from redbeat.schedulers import get_redis as redbeat_client
from sqlalchemy import and_, or_, select

from celeryapp.domain.cadence import Cadence, cadence_of
from celeryapp.domain.names import CONTROL_QUEUE, run_key
from celeryapp.runtime import Runtime
from celeryapp.scheduling.beat_entries import (
    CHUNK,
    ENTRY_COLUMNS,
    FIRE_TASK,
    EntryFields,
    entry_name,
    short_name_list,
)
from celeryapp.scheduling.stored_entry import (
    FIRE_EXPIRY_GRACE,
    CorruptEntry,
    ScheduleEntry,
    aware,
    wrong_type,
)
from models import ExecutionStatus, Schedule, ScheduleExecution, ScheduleStatus, Trigger, transaction, utcnow

logger = logging.getLogger(__name__)


#: A slot beat has passed but the database never saw fired is re-fired after this long.
LOST_FIRE_GRACE = timedelta(seconds=30)
#: A slot is re-fired at most once: a fire merely queued behind others (overload) must not be
#: doubled every pass.
REFIRED_KEY = "refired:"


@dataclass(frozen=True)
class _Overdue:
    name: str
    cadence: Cadence
    slot: datetime
    retry: bool


def refire_lost_slots(app: Runtime, now: datetime | None = None) -> list[str]:
    """Fire again the slots and retries beat moved past whose fire message never arrived.

    RedBeat records a fire before publishing it, so a failed publish (or Redis losing the message,
    or entries rebuilt after a Redis restart) would lose that run. The database knows it was due
    (``next_run_at``, or a pending retry's ``retry_at``, in the past) and the entry knows beat moved
    past it. A regular slot is re-fired as the latest slot beat passed (an older one would be
    superseded by it); a retry only when no run of the schedule is in progress (the end of that
    run starts it). Run keys make a late original and this re-fire one execution.
    """
    ensure_conf(app)
    now = now or utcnow()
    horizon = now - LOST_FIRE_GRACE
    due: list[_Overdue] = []
    with transaction(app.settings.database_url, read_only=True) as session:
        overdue = session.execute(
            select(
                Schedule.id,
                Schedule.current_retry,
                Schedule.next_run_at,
                *ENTRY_COLUMNS,
            ).where(
                Schedule.status == ScheduleStatus.ACTIVE,
                or_(
                    and_(Schedule.retry_at.is_(None), Schedule.next_run_at < horizon),
                    Schedule.retry_at < horizon,
                ),
            )
        ).all()
        for row in overdue:
            fields = EntryFields(
                row.name, row.status, row.cron, row.every_s, row.timezone, row.updated_at, row.retry_at, row.dst
            )
            if row.retry_at is None:
                due.append(_Overdue(row.name, cadence_of(fields), row.next_run_at, False))
                continue
            key = run_key(row.name, Trigger.RETRY, row.retry_at, row.current_retry)
            ran_or_busy = session.scalar(
                select(ScheduleExecution.id)
                .where(
                    ScheduleExecution.schedule_id == row.id,
                    or_(ScheduleExecution.run_key == key, ScheduleExecution.status == ExecutionStatus.IN_PROGRESS),
                )
                .limit(1)
            )
            if ran_or_busy is None:
                due.append(_Overdue(row.name, cadence_of(fields), row.retry_at, True))
    refired: list[str] = []
    client = redbeat_client(app)
    for start in range(0, len(due), CHUNK):
        batch = due[start : start + CHUNK]
        with client.pipeline(transaction=False) as pipe:
            for item in batch:
                pipe.hget(ScheduleEntry.generate_key(app, entry_name(item.name)), "meta")
            metas = pipe.execute(raise_on_error=False)
        for item, meta in zip(batch, metas, strict=True):
            try:
                last_run_at = None if wrong_type(meta) else ScheduleEntry.decode_meta(meta)["last_run_at"]
            except CorruptEntry:
                # When beat last fired it is unknown; beat drops the entry, and the reconcile
                # writes it again from the database.
                continue
            try:
                if _refire(app, item, last_run_at):
                    refired.append(item.name)
            except redis.RedisError:
                raise
            except Exception:
                logger.exception("lost slot of schedule %r cannot be re-fired; the others are", item.name)
    if refired:
        logger.warning("re-fired slots whose fire message was lost: %s", short_name_list(refired))
    return refired


def _refire(app: Runtime, item: _Overdue, last_run_at: datetime | None) -> bool:
    """Fire ``item.slot`` again if beat moved past it (the database never saw it fired)."""
    if last_run_at is None or aware(last_run_at) < item.slot:
        return False  # beat has not reached the slot yet (it is down, or behind): it will fire it
    options: dict[str, Any] = {"queue": CONTROL_QUEUE, "ignore_result": True}
    if item.retry:
        nominal, trigger = item.slot, Trigger.RETRY
    else:
        cadence = item.cadence
        nominal = cadence.latest_slot(aware(last_run_at), since=item.slot - timedelta(microseconds=1)) or item.slot
        trigger = Trigger.CRON if cadence.cron else Trigger.INTERVAL
        options["expires"] = cadence.slot_after(nominal) + FIRE_EXPIRY_GRACE
    marker = app.redbeat_conf.key_prefix + REFIRED_KEY + run_key(item.name, trigger, nominal)
    if not redbeat_client(app).set(marker, "1", nx=True, ex=int(LOST_FIRE_GRACE.total_seconds() * 20)):
        return False  # re-fired once already: that fire is still queued (overload) or ran meanwhile
    app.send_task(
        FIRE_TASK,
        kwargs={"name": item.name, "nominal_at": nominal.isoformat(), "trigger": trigger.value},
        **options,
    )
    return True
