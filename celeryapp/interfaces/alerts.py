"""What operators do with alerts: list them, acknowledge one, silence a schedule until a time (and
end it early), and send a test alert down a channel; JSON in, JSON out.

Each checks every argument first (a wrong one raises :class:`InvalidArgument` naming it, and
nothing is written) and writes its audit row in the transaction of the change, as the other service
operations do. Acknowledging says somebody is on it: the alert stays, its deliveries go on. A
silence keeps the schedule's alerts from being sent (they are still written, marked silenced, and
shown); a new silence replaces the one in force.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from celeryapp.domain.limits import is_unicode, short_repr, type_name
from celeryapp.domain.times import iso
from celeryapp.errors import InvalidArgument, NotFound
from celeryapp.interfaces.arguments import actor_arg, limit_arg, name_arg, reason_arg
from celeryapp.scheduling.store import find_schedule
from celeryapp.states import AuditAction, AuditSource
from models import Alert, AlertDelivery, AlertKind, AlertSilence, transaction, utcnow
from models.alert_tables import ALERT_KEY_LENGTH, ALERTS
from models.session import affected, retried_transaction

if TYPE_CHECKING:
    from celeryapp.application import ChordbeatCelery

#: Most alerts one ``list_alerts`` call returns.
MAX_ALERT_LIMIT = 500
#: What ``list_alerts`` filters on: ``open`` is trouble nobody acknowledged (not silenced, not a
#: ``resolved`` notice, not a test).
ALERT_STATUSES = ("open", "acknowledged", "silenced", "all")
#: Kinds that report no trouble: never open.
NEWS_KINDS = frozenset({AlertKind.RESOLVED, AlertKind.TEST})
#: Longest silence: a schedule nobody wants alerts from for longer should lose its ``alerts``.
MAX_SILENCE_DAYS = 366
#: Longest ``until`` text read (an ISO 8601 time with an offset is 32 characters at most).
_UNTIL_CHARS = 64
#: A test alert has no schedule; stored with this name (shown as null).
NO_SCHEDULE = ""


def alert_id_arg(value: Any, field: str = "id") -> str:
    if not isinstance(value, str):
        raise InvalidArgument(
            field, f"must be an alert id (a string such as failed/nightly/2026-…Z), got {type_name(value)}"
        )
    if not 1 <= len(value) <= ALERT_KEY_LENGTH:
        raise InvalidArgument(field, f"must be 1 to {ALERT_KEY_LENGTH} characters, got {len(value)}")
    if not is_unicode(value) or any(ord(c) < 32 or 127 <= ord(c) < 160 for c in value):
        raise InvalidArgument(field, "must not hold control characters or lone surrogates (no alert id does)")
    return value


def alert_status_arg(value: Any) -> str:
    if value is None:
        return "all"
    if not isinstance(value, str) or value not in ALERT_STATUSES:
        got = short_repr(value) if isinstance(value, str) else type_name(value)
        raise InvalidArgument("status", f"must be one of {', '.join(ALERT_STATUSES)}, got {got}")
    return value


def until_arg(value: Any, now: datetime) -> datetime:
    """The end of a silence: an ISO 8601 time with its offset, after ``now``, within a year."""
    example = "e.g. 2026-11-25T06:00:00Z or 2026-11-25T06:00:00+00:00"
    if not isinstance(value, str):
        raise InvalidArgument(
            "until", f"must be an ISO 8601 time with its UTC offset ({example}), got {type_name(value)}"
        )
    if len(value) > _UNTIL_CHARS:
        raise InvalidArgument("until", f"must be an ISO 8601 time ({example}), got {len(value)} characters")
    try:
        parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise InvalidArgument("until", f"is not an ISO 8601 time ({example}): {short_repr(value)}") from None
    if parsed.tzinfo is None:
        # A time without an offset is read in whatever zone the reader's host is in.
        raise InvalidArgument("until", f"must say its UTC offset ({example}), got {short_repr(value)}")
    try:
        until = parsed.astimezone(UTC)
    except OverflowError:
        raise InvalidArgument("until", f"is out of range: {short_repr(value)}") from None
    if until <= now:
        raise InvalidArgument(
            "until", f"must be in the future (now is {iso(now, timespec='seconds')}), got {short_repr(value)}"
        )
    if until > now + timedelta(days=MAX_SILENCE_DAYS):
        raise InvalidArgument(
            "until",
            f"must be within {MAX_SILENCE_DAYS} days, got {short_repr(value)}; for longer, take the "
            "schedule's alerts out of its definition",
        )
    return until


def alert_json(alert: Alert, deliveries: Iterable[AlertDelivery]) -> dict[str, Any]:
    return {
        "id": alert.key,
        "kind": alert.kind.value,
        "detail": alert.detail,
        "schedule": alert.schedule_name or None,
        "slot": iso(alert.slot_at),
        "execution_id": alert.execution_id,
        "message": alert.message,
        "at": iso(alert.at),
        "expected_at": iso(alert.expected_at),
        "silenced": alert.silenced,
        "acknowledged_by": alert.acknowledged_by,
        "acknowledged_at": iso(alert.acknowledged_at),
        "deliveries": [
            {
                "channel": d.channel,
                "status": d.status.value,
                "attempts": d.attempts,
                "last_error": d.last_error,
                "delivered_at": iso(d.delivered_at),
                "next_try_at": iso(d.next_try_at),
            }
            for d in sorted(deliveries, key=lambda d: d.channel)
        ],
    }


def open_condition() -> Any:
    """An alert somebody still has to look at."""
    return (
        Alert.acknowledged_at.is_(None) & Alert.silenced.is_(False) & Alert.kind.not_in([k.value for k in NEWS_KINDS])
    )


def open_counts(session: Session, names: Iterable[str]) -> dict[str, int]:
    """How many open alerts each of these schedules has (the dashboard's badges)."""
    wanted = list(set(names))
    if not wanted:
        return {}
    query = (
        select(Alert.schedule_name, func.count())
        .where(Alert.schedule_name.in_(wanted), open_condition())
        .group_by(Alert.schedule_name)
    )
    return {name: int(count) for name, count in session.execute(query).all()}


def alerts_json(session: Session, alerts: list[Alert]) -> list[dict[str, Any]]:
    """The alerts with their deliveries, read in one query."""
    by_alert: dict[int, list[AlertDelivery]] = defaultdict(list)
    if alerts:
        for d in session.scalars(select(AlertDelivery).where(AlertDelivery.alert_id.in_([a.id for a in alerts]))):
            by_alert[d.alert_id].append(d)
    return [alert_json(a, by_alert[a.id]) for a in alerts]


def alert_rows(session: Session, *, schedule: str | None, status: str, limit: int) -> list[Alert]:
    """Newest first, by id (``at`` can repeat)."""
    query = select(Alert).order_by(Alert.id.desc()).limit(limit)
    if schedule is not None:
        query = query.where(Alert.schedule_name == schedule)
    if status == "open":
        query = query.where(open_condition())
    elif status == "acknowledged":
        query = query.where(Alert.acknowledged_at.is_not(None))
    elif status == "silenced":
        query = query.where(Alert.silenced.is_(True))
    return list(session.scalars(query))


def list_alerts(
    app: ChordbeatCelery, schedule: str | None = None, status: str | None = None, limit: int = 50
) -> list[dict[str, Any]]:
    schedule = None if schedule is None else name_arg(schedule, "schedule")
    wanted = alert_status_arg(status)
    limit = limit_arg(limit, MAX_ALERT_LIMIT)
    with transaction(app.settings.database_url, read_only=True) as session:
        return alerts_json(session, alert_rows(session, schedule=schedule, status=wanted, limit=limit))


def find_alert(session: Session, key: str) -> Alert:
    alert = session.scalar(select(Alert).where(Alert.key == key))
    if alert is None:
        raise NotFound(f"alert {key!r} does not exist")
    return alert


def get_alert(app: ChordbeatCelery, id: str) -> dict[str, Any]:
    key = alert_id_arg(id)
    with transaction(app.settings.database_url, read_only=True) as session:
        return alerts_json(session, [find_alert(session, key)])[0]


def acknowledge_alert(
    app: ChordbeatCelery,
    id: str,
    actor: str | None = None,
    reason: str | None = None,
    *,
    source: AuditSource = AuditSource.SERVICE,
) -> dict[str, Any]:
    """Somebody is on it. Acknowledging twice changes nothing (the first name and time stay)."""
    key, who, why = alert_id_arg(id), actor_arg(actor, source), reason_arg(reason)

    def ack(session: Session) -> dict[str, Any]:
        now = utcnow()
        alert = find_alert(session, key)
        changed = affected(
            session,
            update(ALERTS)
            .where(ALERTS.c.id == alert.id, ALERTS.c.acknowledged_at.is_(None))
            .values(acknowledged_by=who.name, acknowledged_at=now),
        )
        session.expire(alert)
        detail = {"alert": key, "changed": bool(changed)}
        who.record(
            session,
            AuditAction.ALERT_ACKNOWLEDGED,
            alert.schedule_name or None,
            execution_id=alert.execution_id,
            reason=why,
            detail=detail,
            at=now,
        )
        return alerts_json(session, [alert])[0]

    return retried_transaction(app.settings.database_url, f"acknowledging alert {key!r}", ack)


def silence_of(session: Session, name: str, now: datetime) -> AlertSilence | None:
    """The silence in force for a schedule (the latest ending), if any."""
    query = (
        select(AlertSilence)
        .where(AlertSilence.schedule_name == name, AlertSilence.until > now)
        .order_by(AlertSilence.until.desc())
        .limit(1)
    )
    return session.scalar(query)


def silences_of(session: Session, names: Iterable[str], now: datetime) -> dict[str, AlertSilence]:
    """The silence in force of each of these schedules that has one, in one query."""
    wanted = list(set(names))
    if not wanted:
        return {}
    query = (
        select(AlertSilence)
        .where(AlertSilence.schedule_name.in_(wanted), AlertSilence.until > now)
        .order_by(AlertSilence.until)
    )
    # A new silence ends the one in force, but where two overlap the latest ending wins, as in silence_of.
    return {silence.schedule_name: silence for silence in session.scalars(query)}


def _silence_json(name: str, silence: AlertSilence | None) -> dict[str, Any]:
    return {
        "schedule": name,
        "silenced_until": None if silence is None else iso(silence.until),
        "silenced_by": None if silence is None else silence.actor,
        "reason": None if silence is None else silence.reason,
    }


def _end_silences(session: Session, name: str, now: datetime) -> int:
    ended = update(AlertSilence).where(AlertSilence.schedule_name == name, AlertSilence.until > now).values(until=now)
    return affected(session, ended)


def silence_schedule(
    app: ChordbeatCelery,
    name: str,
    until: str,
    reason: str | None = None,
    actor: str | None = None,
    *,
    source: AuditSource = AuditSource.SERVICE,
) -> dict[str, Any]:
    """No alert of the schedule is sent until ``until`` (ISO 8601 with an offset)."""
    name, who, why = name_arg(name), actor_arg(actor, source), reason_arg(reason)
    end = until_arg(until, utcnow())

    def silence(session: Session) -> dict[str, Any]:
        now = utcnow()
        find_schedule(session, name, lock=True)
        replaced = _end_silences(session, name, now)
        row = AlertSilence(schedule_name=name, until=end, actor=who.name, reason=why, created_at=now)
        session.add(row)
        session.flush()
        detail = {"until": iso(end), "replaced": bool(replaced)}
        who.record(session, AuditAction.SILENCED, name, reason=why, detail=detail, at=now)
        return _silence_json(name, row)

    return retried_transaction(app.settings.database_url, f"silencing schedule {name!r}", silence)


def unsilence_schedule(
    app: ChordbeatCelery,
    name: str,
    actor: str | None = None,
    reason: str | None = None,
    *,
    source: AuditSource = AuditSource.SERVICE,
) -> dict[str, Any]:
    """Alerts of the schedule are sent again from now (those decided while silenced stay unsent)."""
    name, who, why = name_arg(name), actor_arg(actor, source), reason_arg(reason)

    def unsilence(session: Session) -> dict[str, Any]:
        now = utcnow()
        find_schedule(session, name, lock=True)
        changed = _end_silences(session, name, now)
        who.record(session, AuditAction.UNSILENCED, name, reason=why, detail={"changed": bool(changed)}, at=now)
        return {**_silence_json(name, None), "changed": bool(changed)}

    return retried_transaction(app.settings.database_url, f"unsilencing schedule {name!r}", unsilence)
