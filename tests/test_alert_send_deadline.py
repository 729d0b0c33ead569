"""One alert send is bounded as a whole (issue 36): a receiver that answers a byte a second resets
every per-read timeout, so only the overall deadline (``CHORDBEAT_ALERT_SEND_TIMEOUT``) ends it,
for webhooks and for SMTP alike."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from celeryapp.alerting.sender import Sender, send_channel
from celeryapp.config import Settings
from models import DeliveryStatus
from tests.support import alert_wiring
from tests.support.alert_wiring import alert, deliveries
from tests.support.receivers import HttpReceiver, SmtpReceiver, http_receiver, smtp_receiver, trickling_smtp_server  # noqa: F401
from tests.support.servers import wait_for

settings = alert_wiring.settings
wired = alert_wiring.wired
#: The deadline the tests give a send; the receivers would take minutes.
DEADLINE_S = 2.0


@pytest.fixture
def bounded(settings: Settings) -> Settings:
    return dataclasses.replace(settings, alert_send_timeout_s=DEADLINE_S)


def send_in_background(settings: Settings, name: str) -> threading.Event:
    """One pass of the sender over channel ``name`` in a thread; set when it returned."""
    done = threading.Event()
    channel = (Sender(settings).channels() or {}).get(name)

    def run() -> None:
        try:
            send_channel(settings, name, channel)
        finally:
            done.set()

    threading.Thread(target=run, daemon=True).start()
    return done


def test_a_webhook_answering_a_byte_a_second_is_cut_at_the_deadline(
    bounded: Settings, wired: tuple[HttpReceiver, SmtpReceiver]
) -> None:
    settings = bounded
    http, _ = wired
    http.trickle_bytes = 600  # ten minutes of answer at a byte a second
    key = alert(settings, ["hook"])
    done = send_in_background(settings, "hook")
    # Far above the deadline, far below the answer's ten minutes.
    wait_for(done.is_set, timeout=30, what="the send to give up")
    delivery = deliveries(settings, key)["hook"]
    assert delivery.status is DeliveryStatus.PENDING, "retried later, not taken as delivered"
    assert f"within {DEADLINE_S:g} s (CHORDBEAT_ALERT_SEND_TIMEOUT)" in (delivery.last_error or "")
    assert len(http.answered()) == 1, "the receiver got the request; its answer was cut"


def test_an_smtp_server_greeting_a_byte_a_second_is_cut_at_the_deadline(
    bounded: Settings, wired: tuple[HttpReceiver, SmtpReceiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = bounded
    with trickling_smtp_server() as url:
        monkeypatch.setenv("MAIL_URL", url)
        key = alert(settings, ["mail"])
        done = send_in_background(settings, "mail")
        wait_for(done.is_set, timeout=30, what="the send to give up")
    delivery = deliveries(settings, key)["mail"]
    assert delivery.status is DeliveryStatus.PENDING
    assert f"within {DEADLINE_S:g} s (CHORDBEAT_ALERT_SEND_TIMEOUT)" in (delivery.last_error or "")
