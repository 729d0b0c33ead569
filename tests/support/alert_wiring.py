"""The alert tests' shared wiring: a channels file naming every kind of channel, its variables
pointing at the real receivers (tests/support/receivers.py), and the outbox read and written as the
sender sees it. Used by test_alert_delivery (the sender in this process) and
test_alert_sender_thread (the sender in workers)."""

from __future__ import annotations

import contextlib
import dataclasses
import socket
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from celeryapp.alerting.sender import Sender, send_channel
from celeryapp.clock import clock
from celeryapp.config import Settings
from celeryapp.monitoring import metric_counts
from celeryapp.monitoring.alert_outbox import write_alert
from models import Alert, AlertDelivery, AlertKind, MetricCount, transaction
from tests.support.receivers import HttpReceiver, SmtpReceiver, http_receiver, smtp_receiver  # noqa: F401  (fixtures)

SECRET = "s3cret-signing-key"
CHANNELS_FILE = """
channels:
  hook: {kind: webhook, url_env: HOOK_URL, secret_env: HOOK_SECRET, insecure: true}
  chat: {kind: slack, url_env: CHAT_URL, insecure: true}
  mail: {kind: email, to: ["ops@example.com"], smtp_url_env: MAIL_URL, sender: chordbeat@example.com}
  stuck: {kind: webhook, url_env: STUCK_URL, insecure: true}
"""


@pytest.fixture
def settings(settings: Settings, tmp_path: Path) -> Settings:
    path = tmp_path / "channels.yaml"
    path.write_text(CHANNELS_FILE)
    return dataclasses.replace(
        settings,
        alert_channels_file=str(path),
        alert_rate_limit=3,
        dashboard_url="https://chordbeat.example.com",
        alert_poll_interval_s=0.2,
    )


@pytest.fixture
def wired(
    monkeypatch: pytest.MonkeyPatch,
    http_receiver: HttpReceiver,  # noqa: F811
    smtp_receiver: SmtpReceiver,  # noqa: F811
) -> tuple[HttpReceiver, SmtpReceiver]:
    """The channels' variables pointing at the receivers (the sender reads them when it sends)."""
    monkeypatch.setenv("HOOK_URL", http_receiver.url)
    monkeypatch.setenv("HOOK_SECRET", SECRET)
    monkeypatch.setenv("CHAT_URL", http_receiver.url.replace("/hook", "/chat"))
    monkeypatch.setenv("MAIL_URL", smtp_receiver.url)
    return http_receiver, smtp_receiver


def alert(
    settings: Settings, channels: list[str], schedule: str = "nightly-hr-sync", age_s: float = 0, **extra: Any
) -> str:
    """Write an alert to the outbox as a fact's transaction does; its key."""
    now = clock.now() - timedelta(seconds=age_s)
    key = f"failed/{schedule}/execution-{extra.get('execution_id', 7)}-{now.timestamp()}"
    fields: dict[str, Any] = {"execution_id": 7, "message": "nightly-hr-sync: run 7 failed: step export: boom"}
    fields.update(extra)
    with transaction(settings.database_url) as session:
        write_alert(
            session,
            key=key,
            kind=AlertKind(fields.pop("kind", "failed")),
            schedule_name=schedule,
            channels=channels,
            now=now,
            **fields,
        )
    return key


def deliveries(settings: Settings, key: str) -> dict[str, AlertDelivery]:
    with transaction(settings.database_url) as session:
        rows = session.scalars(
            select(AlertDelivery).join(Alert, Alert.id == AlertDelivery.alert_id).where(Alert.key == key)
        ).all()
        session.expunge_all()
        return {row.channel: row for row in rows}


def failures(settings: Settings, channel: str) -> int:
    with transaction(settings.database_url) as session:
        found = session.scalar(
            select(MetricCount.count).where(
                MetricCount.metric == metric_counts.ALERT_DELIVERY_FAILURES, MetricCount.label == channel
            )
        )
        return int(found or 0)


@contextlib.contextmanager
def hanging_server() -> Iterator[str]:
    """A URL whose server accepts connections and never answers."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield f"http://127.0.0.1:{server.getsockname()[1]}/hook"


def send(settings: Settings, *channels: str) -> None:
    """One pass of the sender over ``channels``, in this thread."""
    loaded = Sender(settings).channels()
    assert loaded is not None
    for name in channels:
        send_channel(settings, name, loaded.get(name))


def with_ops_webhook(settings: Settings, tmp_path: Path) -> Settings:
    """``settings`` with a channels file naming one webhook channel, ``ops-webhook``, whose address
    variable is unset: the dashboard's tests need a schedule's alerts to name a channel, not to send."""
    path = tmp_path / "channels.yaml"
    path.write_text("channels:\n  ops-webhook: {kind: webhook, url_env: OPS_WEBHOOK_URL, insecure: true}\n")
    return dataclasses.replace(settings, alert_channels_file=str(path))
