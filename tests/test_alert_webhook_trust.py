"""What a webhook receiver can trust (issue 36): the signature covers the time it was signed as
well as the body, so a delivery replayed later is refused by the check docs/alerts.md gives; and
alerts go in clear over ``http://`` only to a channel that says ``insecure: true``."""

from __future__ import annotations

import logging
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from celeryapp.alerting.channels import Channel, clear_text_refusal, load_channels
from celeryapp.config import Settings
from celeryapp.errors import ConfigError
from models import DeliveryStatus
from tests.support import alert_wiring
from tests.support.alert_wiring import SECRET, alert, deliveries, send
from tests.support.receivers import REPLAY_WINDOW_S, HttpReceiver, Request, SmtpReceiver, http_receiver, smtp_receiver  # noqa: F401

settings = alert_wiring.settings
wired = alert_wiring.wired


def post_again(url: str, request: Request, **changed: str) -> int:
    """``request`` sent again as an eavesdropper would, headers and body as recorded; the status."""
    headers = {k: v for k, v in request.headers.items() if k not in {"host", "content-length", "connection"}}
    again = urllib.request.Request(url, data=request.body, headers={**headers, **changed}, method="POST")
    try:
        with urllib.request.urlopen(again, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_delivery_is_signed_over_its_time_and_a_replay_past_the_window_is_refused(
    settings: Settings, wired: tuple[HttpReceiver, SmtpReceiver]
) -> None:
    http, _ = wired
    http.secret = SECRET  # the receiver checks each request as docs/alerts.md says
    key = alert(settings, ["hook"])
    send(settings, "hook")
    [delivered] = http.wait(1, status=None)
    assert delivered.status == 200, "the receiver's check refused a fresh delivery"
    assert delivered.json()["id"] == key and delivered.signature_valid(SECRET)
    # Replayed whole, later than the window: refused.
    http.clock_offset_s = REPLAY_WINDOW_S + 1
    assert post_again(http.url, delivered) == 401
    # A fresh timestamp on the old signature: refused too, the timestamp is signed.
    now = str(int(delivered.received_at + http.clock_offset_s))
    assert post_again(http.url, delivered, **{"X-Chordbeat-Timestamp": now}) == 401
    http.clock_offset_s = 0.0
    assert post_again(http.url, delivered) == 200, "within the window (the receiver de-duplicates on id)"


@pytest.fixture
def plain(settings: Settings, monkeypatch: pytest.MonkeyPatch, http_receiver: HttpReceiver) -> Settings:  # noqa: F811
    """alert_wiring's channels and one more, ``plain``, whose http:// URL it does not call insecure."""
    assert settings.alert_channels_file is not None
    path = Path(settings.alert_channels_file)
    path.write_text(path.read_text() + "  plain: {kind: webhook, url_env: PLAIN_URL, secret_env: HOOK_SECRET}\n")
    monkeypatch.setenv("PLAIN_URL", http_receiver.url.replace("/hook", "/plain"))
    return settings


def test_an_http_webhook_is_refused_unless_its_channel_says_insecure(
    plain: Settings, wired: tuple[HttpReceiver, SmtpReceiver], caplog: pytest.LogCaptureFixture
) -> None:
    http, _ = wired
    key = alert(plain, ["plain", "hook"])
    with caplog.at_level(logging.ERROR, logger="celeryapp.alerting.sender"):
        send(plain, "plain", "hook")
    refusal = "channels.plain.url_env: PLAIN_URL is an http:// URL; alerts are sent over https:// only"
    assert any(refusal in r.getMessage() for r in caplog.records), "said when the file is loaded"
    states = deliveries(plain, key)
    assert states["plain"].status is DeliveryStatus.PENDING and refusal in (states["plain"].last_error or "")
    # The channel that says insecure: true (alert_wiring's hook, loopback too) is delivered to.
    assert [r.path for r in http.wait(1)] == ["/hook"]
    assert states["hook"].status is DeliveryStatus.DELIVERED


@pytest.mark.parametrize(
    ("fields", "refused"),
    [
        ("url_env: U, insecure: 'yes'", "channels.c.insecure: must be true or false, got 'yes'"),
        ("url_env: U, insecure: 1", "channels.c.insecure: must be true or false, got 1"),
        ("to: [a@example.com], insecure: true", "channels.c.insecure: unknown field for a email channel"),
    ],
)
def test_insecure_is_a_yaml_boolean_of_http_channels_only(tmp_path: Path, fields: str, refused: str) -> None:
    kind = "email" if "to:" in fields else "webhook"
    path = tmp_path / "channels.yaml"
    path.write_text(f"channels:\n  c: {{kind: {kind}, {fields}}}\n")
    with pytest.raises(ConfigError) as caught:
        load_channels(str(path))
    assert refused in str(caught.value)


@pytest.mark.parametrize(
    ("url", "insecure", "refused"),
    [
        ("http://hooks.example.com/x", False, True),
        ("HTTP://hooks.example.com/x", False, True),
        (" http://hooks.example.com/x", False, True),
        ("http://127.0.0.1:8080/x", False, True),
        ("http://[::1]:8080/x", False, True),
        ("http://127.0.0.1:8080/x", True, False),
        ("https://hooks.example.com/x", False, False),
    ],
)
def test_which_urls_are_in_clear(url: str, insecure: bool, refused: bool) -> None:
    channel = Channel("c", "webhook", url_env="U", insecure=insecure)
    assert (clear_text_refusal(channel, url) is not None) is refused
