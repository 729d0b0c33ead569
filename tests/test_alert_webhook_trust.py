"""What a webhook receiver can trust (issue 36): the signature covers the time it was signed as
well as the body, so a delivery replayed later is refused by the check docs/alerts.md gives; and
alerts go in clear over ``http://`` only to a channel that says ``insecure: true``."""

from __future__ import annotations

import urllib.error
import urllib.request

from celeryapp.alerting.sender import Sender, send_channel
from celeryapp.config import Settings
from tests import alert_wiring
from tests.alert_wiring import SECRET, alert
from tests.receivers import REPLAY_WINDOW_S, HttpReceiver, Request, SmtpReceiver, http_receiver, smtp_receiver  # noqa: F401

settings = alert_wiring.settings
wired = alert_wiring.wired


def send(settings: Settings, *channels: str) -> None:
    """One pass of the sender over ``channels``, in this thread."""
    loaded = Sender(settings).channels()
    assert loaded is not None
    for name in channels:
        send_channel(settings, name, loaded.get(name))


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
