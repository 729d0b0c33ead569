"""A test alert: one channel's wiring checked end to end (``chordbeat alerts test CHANNEL``).

A broker caller may ask for one, so a test is held to what an alert is: it counts in the
channel's rate limit (the sender holds tests past it; past it the call itself is refused), and
its message is chordbeat's, marked as a test from its first words, the caller's name and reason
quoted and cut, never a message of the caller's own on a pager."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from celeryapp.alerting.channels import channel_names
from celeryapp.domain.alert_delivery import RATE_WINDOW_S
from celeryapp.domain.limits import short_repr, type_name
from celeryapp.domain.times import iso
from celeryapp.errors import InvalidArgument
from celeryapp.interfaces.alerts import NO_SCHEDULE, alerts_json, find_alert
from celeryapp.interfaces.arguments import actor_arg, reason_arg
from celeryapp.monitoring.alert_outbox import write_alert
from celeryapp.states import AuditAction, AuditSource
from models import Alert, AlertDelivery, AlertKind, utcnow
from models.audit import Actor
from models.session import retried_transaction

if TYPE_CHECKING:
    from celeryapp.application import ChordbeatCelery

#: Characters of the caller's name and note a test alert's message carries (the audit trail
#: keeps them whole): enough to say who and why, too few for a message of the caller's own.
TEST_ACTOR_CHARS = 40
TEST_NOTE_CHARS = 80


def channel_arg(app: ChordbeatCelery, value: Any) -> str:
    """A channel of the deployment's channels file."""
    if not isinstance(value, str):
        raise InvalidArgument("channel", f"must be a channel's name (a string), got {type_name(value)}")
    names = channel_names(app.settings)
    if not names:
        raise InvalidArgument("channel", "no channel is defined: CHORDBEAT_ALERT_CHANNELS names no channels file")
    if value not in names:
        raise InvalidArgument(
            "channel",
            f"no channel {short_repr(value)} in {app.settings.alert_channels_file}; "
            f"its channels: {', '.join(sorted(names))}",
        )
    return value


def test_alert(
    app: ChordbeatCelery,
    channel: str,
    actor: str | None = None,
    reason: str | None = None,
    *,
    source: AuditSource = AuditSource.SERVICE,
) -> dict[str, Any]:
    """A ``test`` alert for one channel, delivered like any other: its delivery says whether the
    wiring works (``get_alert`` follows it)."""
    who, why = actor_arg(actor, source), reason_arg(reason)
    channel = channel_arg(app, channel)

    def send(session: Session) -> dict[str, Any]:
        now = utcnow()
        _refuse_past_the_rate_limit(session, channel, now, app.settings.alert_rate_limit)
        # Each test its own alert: the same channel tested twice in a millisecond is two tests.
        key = f"{AlertKind.TEST.value}/{channel}/{iso(now)}/{uuid.uuid4().hex[:8]}"
        write_alert(
            session,
            key=key,
            kind=AlertKind.TEST,
            schedule_name=NO_SCHEDULE,
            message=_test_message(channel, who, why),
            channels=[channel],
            now=now,
        )
        who.record(session, AuditAction.ALERT_TEST, None, reason=why, detail={"channel": channel, "alert": key}, at=now)
        return alerts_json(session, [find_alert(session, key)])[0]

    return retried_transaction(app.settings.database_url, f"testing channel {channel!r}", send)


def _refuse_past_the_rate_limit(session: Session, channel: str, now: datetime, limit: int) -> None:
    """The channel's rate limit counts tests too (the sender holds those past it): a caller asking
    for more in the window is told at once instead of waiting for a delivery that waits."""
    since = now - timedelta(seconds=RATE_WINDOW_S)
    query = (
        select(func.count(), func.min(Alert.at))
        .select_from(Alert)
        .join(AlertDelivery, AlertDelivery.alert_id == Alert.id)
        .where(Alert.kind == AlertKind.TEST, AlertDelivery.channel == channel, Alert.at >= since)
    )
    count, first = session.execute(query).one()
    if count >= limit:
        wait_s = max(RATE_WINDOW_S - (now - first).total_seconds(), 1.0)
        raise InvalidArgument(
            "channel",
            f"{count} test alerts to {channel} in the last {RATE_WINDOW_S:g} s already, the channel's rate "
            f"limit (CHORDBEAT_ALERT_RATE_LIMIT={limit}); try again in {wait_s:.0f} s",
        )


def _test_message(channel: str, who: Actor, why: str | None) -> str:
    """Marked a test from its first words; the caller's words quoted, one line, cut: a test can
    reach a pager or a mailbox, and must not read as chordbeat's own (\"URGENT: re-authenticate
    at ...\")."""
    text = f"TEST, not an alert: chordbeat test of channel {channel}, asked by {_quoted(who.name, TEST_ACTOR_CHARS)}"
    text += f" ({who.source.value})"
    return text if why is None else f'{text}; note: "{_quoted(why, TEST_NOTE_CHARS)}"'


def _quoted(text: str, limit: int) -> str:
    printable = "".join(c if c.isprintable() else " " for c in text).replace('"', "'")
    return printable if len(printable) <= limit else printable[: limit - 1] + "…"
