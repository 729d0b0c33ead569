"""Waiters of shared limits that no release will wake: recovery's pass settles them, and raises
``starved`` when a limit's oldest waiter has waited longer than its ``max_wait``.

A release admits the next waiters in its own transaction, so most waiters never need this. A
waiter held back only by a rate's tokens, which time brings back, not a release, is woken by a
message due when its token is (``chordbeat.settle_limits``, sent by the pass that found it
waiting: :func:`settle_due`). Recovery's pass is the backstop: for such a message lost, and for
an admission lost with a transaction that failed after a limit changed. Each recovery
pass (``CHORDBEAT_RECOVERY_INTERVAL``) settles each limit that has waiters and could admit one now
(a slot free and, with a rate, a token there: read off its row, unlocked), in its own transaction,
and sends what it admitted after commit. A full limit is left to its releases. At idle (no waiter
anywhere) the pass is one query on the limits.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial

from sqlalchemy import exists, select
from sqlalchemy.orm import Session

from celeryapp.domain.effects import Effects
from celeryapp.domain.limit_admission import Bucket
from celeryapp.domain.shared_limits import parse_rate
from celeryapp.execution.limit_slots import settle
from celeryapp.execution.limit_steps import admitted_steps
from celeryapp.monitoring.alert_outbox import alert_key, is_silenced, write_alert
from celeryapp.runtime import Runtime
from celeryapp.worker.dispatch import apply_effects
from models import AlertKind, Schedule, ScheduleExecution
from models.limit_tables import LIMIT_WAITERS, LIMITS
from models.session import retried_transaction, transaction

logger = logging.getLogger(__name__)

#: The alert kind a schedule's ``alerts.on`` must name for its ``starved`` alerts to be delivered
#: (a starved step makes its run late); the alert is recorded either way.
STARVED_ENABLED_BY = AlertKind.LATE


@dataclass(frozen=True)
class WaitedLimit:
    id: int
    name: str
    max_wait_s: float | None
    #: Whether a pass could admit anyone now: a slot is free and, with a rate, a token is there
    #: (read off the row, without its lock). A full limit is left to its releases.
    may_admit: bool


def waiting_limits(session: Session, now: datetime) -> list[WaitedLimit]:
    """The limits with waiters."""
    waited = exists().where(LIMIT_WAITERS.c.limit_id == LIMITS.c.id)
    rows = session.execute(select(LIMITS).where(waited).order_by(LIMITS.c.id))
    found = []
    for row in rows:
        rate = parse_rate(row.definition.get("rate"))
        token = (
            rate is None
            or row.tokens is None
            or row.tokens_at is None
            or Bucket(rate.count, rate.per_s, row.tokens, row.tokens_at).level_at(now) >= 1.0
        )
        max_wait = row.definition.get("max_wait")
        found.append(WaitedLimit(row.id, row.name, max_wait, row.in_use < row.slots and token))
    return found


def settle_due(app: Runtime, limit_ids: Sequence[int], *, now: datetime) -> int:
    """A pass over these limits sent for its moment (a rate's token back, or limits a pass could
    not lock): whoever fits is admitted and sent; a pass still due later sends its own message.
    How many steps it admitted."""
    settling = partial(settle_limits, limit_ids=limit_ids, now=now)
    effects = retried_transaction(app.settings.database_url, f"settling limits {list(limit_ids)}", settling)
    apply_effects(app, effects)
    return sum(len(group.steps) for group in effects.dispatch)


def settle_limits(session: Session, limit_ids: Sequence[int], *, now: datetime) -> Effects:
    """Admit whoever fits the limits now (a rate's token came back); what to send after commit."""
    return admitted_steps(session, settle(session, limit_ids, now=now), now=now)


def alert_starved(session: Session, limit_id: int, name: str, max_wait_s: float, *, now: datetime) -> int | None:
    """A ``starved`` alert for the run of the limit's oldest waiter, if it has waited longer than
    ``max_wait``; once per run (the alert's key). Its id, or None."""
    oldest = session.execute(
        select(LIMIT_WAITERS.c.execution_id, LIMIT_WAITERS.c.step_name, LIMIT_WAITERS.c.enqueued_at)
        .where(LIMIT_WAITERS.c.limit_id == limit_id)
        .order_by(LIMIT_WAITERS.c.enqueued_at, LIMIT_WAITERS.c.id)
        .limit(1)
    ).first()
    if oldest is None or oldest.enqueued_at > now - timedelta(seconds=max_wait_s):
        return None
    # The run's schedule may have been deleted since (its runs go on): the run keeps its name.
    schedule_name, config = session.execute(
        select(ScheduleExecution.schedule_name, Schedule.alerts)
        .outerjoin(Schedule, Schedule.id == ScheduleExecution.schedule_id)
        .where(ScheduleExecution.id == oldest.execution_id)
    ).one()
    waited_s = (now - oldest.enqueued_at).total_seconds()
    channels = config.get("channels", ()) if config and STARVED_ENABLED_BY.value in config.get("on", ()) else ()
    return write_alert(
        session,
        key=alert_key(AlertKind.STARVED, schedule_name, execution_id=oldest.execution_id),
        kind=AlertKind.STARVED,
        schedule_name=schedule_name,
        message=(
            f"step {oldest.step_name!r} of execution {oldest.execution_id} has waited {waited_s:.0f}s for "
            f"limit {name!r}, longer than its max_wait of {max_wait_s:g}s"
        ),
        channels=channels,
        now=now,
        execution_id=oldest.execution_id,
        detail=name,
        silenced=is_silenced(session, schedule_name, now),
    )


def settle_waiting_limits(app: Runtime, *, now: datetime) -> list[str]:
    """Recovery's part: each limit with waiters settled (and checked for starving) in a
    transaction of its own, what it admitted sent after commit; the names of the limits that
    admitted someone. One limit's failure is logged and the others go on."""
    url = app.settings.database_url
    with transaction(url, read_only=True) as session:
        limits = waiting_limits(session, now)
    admitted: list[str] = []
    for limit in limits:
        name = limit.name
        try:
            if limit.may_admit:
                settling = partial(settle_limits, limit_ids=[limit.id], now=now)
                effects = retried_transaction(url, f"settling limit {name!r}", settling)
                apply_effects(app, effects)
                if effects.dispatch:
                    admitted.append(name)
            if limit.max_wait_s is not None:
                starving = partial(alert_starved, limit_id=limit.id, name=name, max_wait_s=limit.max_wait_s, now=now)
                retried_transaction(url, f"checking limit {name!r} for starving waiters", starving)
        except Exception:
            logger.exception("recovery: settling limit %r failed; the other limits go on", name)
    return admitted
