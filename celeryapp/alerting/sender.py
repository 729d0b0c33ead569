"""The alert sender: deliveries due in the outbox go out, are retried with backoff, or are given up.

One pass asks which channels have deliveries due (one grouped query, usually answering nothing)
and hands each channel to its own thread of a pool: a receiver that hangs holds its own channel for
at most a send's timeout, never another channel, and never a step or a control task (the sender
runs beside them in the worker's main process). A channel with a job still running is left for the
next pass, so a channel's messages go out one at a time, in order.

Each delivery is claimed by compare-and-set before it is sent (``lease_until`` in the future,
``attempts`` counted): two senders (a lease lost during a pause, say) never send it at once, and a
sender killed mid-send leaves a claim that lapses after :data:`DELIVERY_LEASE_S`, when the next
sender tries it again. Delivery is at least once: receivers de-duplicate on the alert's ``id``.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from email.message import EmailMessage

from sqlalchemy import ColumnElement, and_, func, or_, select, update
from sqlalchemy.orm import Session

from celeryapp.alerting import messages, transports
from celeryapp.alerting.channels import (
    DEFAULT_SENDER,
    DEFAULT_SMTP_URL_ENV,
    Channel,
    clear_text_refusal,
    load_channels,
)
from celeryapp.alerting.log_masking import masked_logger, remember
from celeryapp.alerting.messages import AlertText
from celeryapp.alerting.transports import SendFailed
from celeryapp.clock import clock
from celeryapp.config import Settings, environment_variable
from celeryapp.domain import alert_delivery
from celeryapp.domain.times import iso
from celeryapp.errors import ConfigError
from celeryapp.monitoring import metric_counts
from models import Alert, AlertDelivery, AlertKind, DeliveryStatus, transaction

logger = masked_logger(__name__)

#: Seconds a claimed delivery is the claimer's: longer than a send takes (a send gives up after
#: ``CHORDBEAT_ALERT_SEND_TIMEOUT``, at most ``MAX_ALERT_SEND_TIMEOUT_S``); a send still going after
#: this may be repeated by another sender, which at-least-once delivery allows.
DELIVERY_LEASE_S = 60.0
#: Due deliveries of one channel read in one pass: a storm beyond it is summarised over passes.
MAX_DUE_PER_PASS = 500
#: Threads sending at once: one per channel with deliveries due (the channels file has at most 100).
MAX_SENDING_CHANNELS = 100
#: Longest error kept with a delivery.
ERROR_CHARS = 500
#: A channel named in a definition but not in the channels file (removed since): retried, then given up.
NOT_A_CHANNEL = "channel {name!r} is not in the CHORDBEAT_ALERT_CHANNELS file"


@dataclass(frozen=True)
class DueDelivery:
    """A delivery due, with its alert."""

    delivery_id: int
    attempts: int
    alert: AlertText


class Sender:
    """Sends the due deliveries, one thread per channel; :meth:`poll` starts what is due."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.pool = ThreadPoolExecutor(max_workers=MAX_SENDING_CHANNELS, thread_name_prefix="chordbeat-alert")
        self.busy: dict[str, Future[None]] = {}
        self._channels: tuple[tuple[int, int] | None, dict[str, Channel]] = (None, {})
        self._file_error: str | None = None

    def poll(self) -> int:
        """Start a job for each channel with deliveries due and none running; how many started."""
        channels = self.channels()
        if channels is None:
            return 0
        started = 0
        for name in due_channels(self.settings.database_url, clock.now()):
            job = self.busy.get(name)
            if job is not None and not job.done():
                continue
            self.busy[name] = self.pool.submit(self._job, name, channels.get(name))
            started += 1
        return started

    def close(self, wait_s: float) -> None:
        """Let running sends end (each within its timeout), waiting at most ``wait_s``."""
        for job in list(self.busy.values()):
            with contextlib.suppress(Exception):  # the job logged it
                job.result(timeout=wait_s)
        self.pool.shutdown(wait=False, cancel_futures=True)

    def channels(self) -> dict[str, Channel] | None:
        """The channels file's channels, read again when it changed; ``None`` while it is broken
        or not configured (nothing is sent, nothing counts as an attempt: the operator is fixing
        the file, or has not yet said where alerts go)."""
        path = self.settings.alert_channels_file
        if path is None:
            return None
        try:
            stat = os.stat(path)
            version: tuple[int, int] | None = (stat.st_mtime_ns, stat.st_size)
        except OSError:
            version = None
        if version is not None and version == self._channels[0]:
            return self._channels[1]
        try:
            loaded = load_channels(path)
        except ConfigError as exc:
            if str(exc) != self._file_error:
                logger.error("alerts are not sent until the channels file is fixed: %s", exc)
            self._file_error = str(exc)
            return None
        self._channels, self._file_error = (version, loaded), None
        _say_clear_text_channels(path, loaded)
        return loaded

    def _job(self, name: str, channel: Channel | None) -> None:
        try:
            send_channel(self.settings, name, channel)
        except Exception:
            # The next pass tries again; a claim taken before the failure lapses on its own.
            logger.exception("sending the alerts of channel %s failed", name)


def _say_clear_text_channels(path: str, channels: dict[str, Channel]) -> None:
    """At load, each channel whose URL is http:// without ``insecure: true``: its deliveries fail
    saying the same, but the operator learns it before the first alert."""
    for channel in channels.values():
        url = environment_variable(channel.url_env) if channel.url_env else None
        refusal = clear_text_refusal(channel, url) if url else None
        if refusal:
            logger.error("%s: %s; its alerts are not sent", path, refusal)


def due_channels(database_url: str, now: datetime) -> list[str]:
    """The channels with deliveries due and unclaimed at ``now``."""
    with transaction(database_url, read_only=True) as session:
        rows = session.execute(select(AlertDelivery.channel).where(_due(now)).group_by(AlertDelivery.channel))
        return [str(name) for name in rows.scalars()]


def send_channel(settings: Settings, name: str, channel: Channel | None) -> None:
    """Send a channel's due deliveries, oldest first: alerts up to the rate limit and the rest
    folded into one summary, then tests with the room the alerts left (the others wait: a test
    is never summarised, and never crowds an alert out). Stops at the first failure: the
    receiver is likely down, and the others wait for the next pass instead of each waiting for
    its timeout now."""
    now = clock.now()
    due = due_deliveries(settings.database_url, name, now)
    tests = [d for d in due if d.alert.kind == AlertKind.TEST.value]
    alerts = [d for d in due if d.alert.kind != AlertKind.TEST.value]
    sent, summarised = sent_in_window(settings.database_url, name, now)
    plan = alert_delivery.plan_channel(len(alerts), sent, summarised, settings.alert_rate_limit)
    room = max(settings.alert_rate_limit - sent - plan.send, 0)
    for one in [*alerts[: plan.send], *tests[:room]]:
        if not claim(settings.database_url, one.delivery_id):
            continue
        error = attempt(functools.partial(send_one, settings, name, channel, one.alert))
        record(settings, name, [one], error)
        if error is not None:
            return
    folded = alerts[plan.send : plan.send + plan.summarise]
    claimed = [d for d in folded if claim(settings.database_url, d.delivery_id)]
    if claimed:
        texts = [d.alert for d in claimed]
        error = attempt(functools.partial(send_summary, settings, name, channel, texts))
        record(settings, name, claimed, error, status=DeliveryStatus.SUMMARISED)


def due_deliveries(database_url: str, channel: str, now: datetime) -> list[DueDelivery]:
    query = (
        select(AlertDelivery.id, AlertDelivery.attempts, Alert)
        .join(Alert, Alert.id == AlertDelivery.alert_id)
        .where(AlertDelivery.channel == channel, _due(now))
        .order_by(AlertDelivery.next_try_at, AlertDelivery.id)
        .limit(MAX_DUE_PER_PASS)
    )
    with transaction(database_url, read_only=True) as session:
        return [DueDelivery(int(i), int(n), _text(alert)) for i, n, alert in session.execute(query)]


def sent_in_window(database_url: str, channel: str, now: datetime) -> tuple[int, bool]:
    """Messages the channel got in the rate limit's window: alerts and tests sent one by one (a
    caller's tests count: sixty of them are no way past the limit), and whether a summary went
    (asked only of a channel with deliveries due)."""
    since = now - timedelta(seconds=alert_delivery.RATE_WINDOW_S)
    query = (
        select(AlertDelivery.status, func.count())
        .where(
            AlertDelivery.channel == channel,
            AlertDelivery.status.in_([DeliveryStatus.DELIVERED, DeliveryStatus.SUMMARISED]),
            AlertDelivery.delivered_at >= since,
        )
        .group_by(AlertDelivery.status)
    )
    with transaction(database_url, read_only=True) as session:
        counts = {DeliveryStatus(status): int(n) for status, n in session.execute(query)}
    return counts.get(DeliveryStatus.DELIVERED, 0), counts.get(DeliveryStatus.SUMMARISED, 0) > 0


def claim(database_url: str, delivery_id: int) -> bool:
    """Take the delivery for :data:`DELIVERY_LEASE_S` and count the attempt, unless another
    sender holds it or it is no longer pending (compare-and-set)."""
    now = clock.now()
    statement = (
        update(AlertDelivery)
        .where(AlertDelivery.id == delivery_id, _due(now))
        .values(lease_until=now + timedelta(seconds=DELIVERY_LEASE_S), attempts=AlertDelivery.attempts + 1)
        .execution_options(synchronize_session=False)
    )
    with transaction(database_url) as session:
        return session.execute(statement).rowcount == 1  # type: ignore[attr-defined,no-any-return]


def attempt(send: Callable[[], None]) -> str | None:
    """``None`` if ``send`` delivered, else the error to keep (secrets masked by the transports)."""
    try:
        send()
    except SendFailed as exc:
        return str(exc)[:ERROR_CHARS]
    except Exception as exc:  # whatever broke, the delivery is retried
        logger.exception("an alert could not be sent")
        return f"could not send: {type(exc).__name__}"
    return None


def record(
    settings: Settings,
    channel: str,
    done: list[DueDelivery],
    error: str | None,
    *,
    status: DeliveryStatus = DeliveryStatus.DELIVERED,
) -> None:
    """Store the outcome of one attempt (of one alert or of a summary of several): delivered, or
    tried again later, or given up after ``alert_retry_for_s``; a failed attempt is counted in
    ``alert_delivery_failures{channel}``."""
    now = clock.now()
    with transaction(settings.database_url) as session:
        for one in done:
            _record_one(session, settings, one, error, status, now)
        if error is not None:
            counts = metric_counts.Counts()
            counts.count(metric_counts.ALERT_DELIVERY_FAILURES, "", channel)
            counts.add_to(session)
    if error is None:
        logger.info("alert %s %s to %s", done[0].alert.key, status.value, channel)
    else:
        logger.warning("alert %s not delivered to %s: %s", done[0].alert.key, channel, error)


def _record_one(
    session: Session, settings: Settings, one: DueDelivery, error: str | None, status: DeliveryStatus, now: datetime
) -> None:
    # Only a pending delivery: another sender (whose claim this one's outlived) may have ended it.
    pending = update(AlertDelivery).where(
        AlertDelivery.id == one.delivery_id, AlertDelivery.status == DeliveryStatus.PENDING
    )
    if error is None:
        values: dict[str, object] = {"status": status, "delivered_at": now, "lease_until": None, "last_error": None}
    else:
        later = alert_delivery.next_try_at(one.alert.at, now, one.attempts + 1, settings.alert_retry_for_s)
        values = {"last_error": error, "lease_until": None}
        values.update({"status": DeliveryStatus.FAILED} if later is None else {"next_try_at": later})
    session.execute(pending.values(**values).execution_options(synchronize_session=False))


def send_one(settings: Settings, name: str, channel: Channel | None, alert: AlertText) -> None:
    """Send one alert's message down the channel; raise :class:`SendFailed` if it was not taken."""
    where = settings.dashboard_url
    if channel is None:
        raise SendFailed(NOT_A_CHANNEL.format(name=name))
    if channel.kind == "email":
        message = messages.email(alert, sender=_sender(channel), to=channel.to, dashboard_url=where)
        _mail(settings, channel, message)
    elif channel.kind == "slack":
        transports.post(_url(channel), messages.slack_body(alert, where), {}, deadline_s=settings.alert_send_timeout_s)
    else:
        _webhook(settings, channel, messages.webhook_body(alert, where))


def send_summary(settings: Settings, name: str, channel: Channel | None, alerts: list[AlertText]) -> None:
    """One message standing for ``alerts``, which the rate limit held back."""
    where, now = settings.dashboard_url, clock.now()
    key = f"{messages.SUMMARY_KIND}/{name}/{iso(now)}"
    if channel is None:
        raise SendFailed(NOT_A_CHANNEL.format(name=name))
    if channel.kind == "email":
        summary = messages.summary_email(key, alerts, sender=_sender(channel), to=channel.to, dashboard_url=where)
        _mail(settings, channel, summary)
    elif channel.kind == "slack":
        body = messages.summary_slack_body(alerts, where)
        transports.post(_url(channel), body, {}, deadline_s=settings.alert_send_timeout_s)
    else:
        _webhook(settings, channel, messages.summary_webhook_body(key, alerts, now, where))


def _webhook(settings: Settings, channel: Channel, body: bytes) -> None:
    headers = {}
    if channel.secret_env is not None:
        secret = environment_variable(channel.secret_env)
        if secret is not None:
            remember(secret, url=False)
        if secret is None:
            # Unsigned, the receiver would (rightly) refuse it or, worse, trust it.
            raise SendFailed(f"{channel.secret_env} is not set (the webhook's signing secret)")
        # Each attempt is signed at its own time: a retry hours later is still within the window.
        timestamp = int(clock.now().timestamp())
        headers[messages.TIMESTAMP_HEADER] = str(timestamp)
        headers[messages.SIGNATURE_V2_HEADER] = messages.timestamped_signature(timestamp, body, secret)
        headers[messages.SIGNATURE_HEADER] = messages.signature(body, secret)
    transports.post(_url(channel), body, headers, deadline_s=settings.alert_send_timeout_s)


def _url(channel: Channel) -> str:
    assert channel.url_env is not None  # the channels file requires it of webhooks and Slack
    url = environment_variable(channel.url_env)
    if url is None:
        raise SendFailed(f"{channel.url_env} is not set")
    usable = transports.http_url(remember(url), channel.url_env)
    refusal = clear_text_refusal(channel, usable)
    if refusal:
        raise SendFailed(refusal)
    return usable


def _mail(settings: Settings, channel: Channel, message: EmailMessage) -> None:
    variable = channel.smtp_url_env or DEFAULT_SMTP_URL_ENV
    smtp_url = environment_variable(variable)
    if smtp_url is None:
        raise SendFailed(f"{variable} is not set")
    transports.send_mail(remember(smtp_url), variable, message, deadline_s=settings.alert_send_timeout_s)


def _sender(channel: Channel) -> str:
    return channel.sender or DEFAULT_SENDER


def _due(now: datetime) -> ColumnElement[bool]:
    return and_(
        AlertDelivery.status == DeliveryStatus.PENDING,
        AlertDelivery.next_try_at <= now,
        or_(AlertDelivery.lease_until.is_(None), AlertDelivery.lease_until < now),
    )


def _text(alert: Alert) -> AlertText:
    return AlertText(
        key=alert.key,
        kind=alert.kind.value,
        schedule_name=alert.schedule_name,
        message=alert.message,
        at=alert.at,
        detail=alert.detail,
        slot_at=alert.slot_at,
        execution_id=alert.execution_id,
        expected_at=alert.expected_at,
    )
