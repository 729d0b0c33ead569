"""Alerts reach real receivers: a webhook (signed JSON), Slack (text), email (plain and HTML) through
a real SMTP server; failing receivers are retried with backoff, then given up; a storm is summarised;
hostile and huge text stays in its place; secrets stay out of errors and logs; claims are taken once;
a receiver that hangs holds up no other channel. (In workers: test_alert_sender_thread.)"""

from __future__ import annotations

import dataclasses
import http.client
import logging
from datetime import timedelta

import pytest
from sqlalchemy import select, update

from celeryapp.alerting import messages
from celeryapp.alerting.log_masking import masked_logger, remember
from celeryapp.alerting.sender import Sender
from celeryapp.application import ChordbeatCelery
from celeryapp.clock import clock
from celeryapp.config import Settings
from celeryapp.errors import InvalidArgument
from celeryapp.interfaces import wiring_checks
from models import Alert, AlertDelivery, DeliveryStatus, transaction
from tests.support import alert_wiring
from tests.support.alert_wiring import SECRET, alert, deliveries, failures, hanging_server, send
from tests.support.receivers import HttpReceiver, SmtpReceiver, http_receiver, smtp_receiver  # noqa: F401  (fixtures)
from tests.support.servers import free_port, wait_for

#: The alert tests' fixtures (tests/support/alert_wiring.py): a channels file, its variables naming the receivers.
settings = alert_wiring.settings
wired = alert_wiring.wired


def test_each_kind_of_channel_gets_its_message(settings: Settings, wired: tuple[HttpReceiver, SmtpReceiver]) -> None:
    http, smtp = wired
    key = alert(settings, ["hook", "chat", "mail"], slot_at=clock.now().replace(microsecond=0))
    send(settings, "hook", "chat", "mail")

    [hook] = [r for r in http.wait(2) if r.path == "/hook"]
    assert hook.signature_valid(SECRET) and hook.headers["content-type"] == "application/json"
    body = hook.json()
    assert (body["id"], body["kind"], body["schedule"], body["execution_id"]) == (key, "failed", "nightly-hr-sync", 7)
    assert body["message"].endswith("boom") and body["slot"].endswith("Z") and body["at"].endswith("Z")
    assert body["url"] == "https://chordbeat.example.com/execution/7"
    [chat] = [r for r in http.answered() if r.path == "/chat"]
    text = chat.json()["text"]
    assert "failed nightly-hr-sync" in text and "boom" in text
    assert "<https://chordbeat.example.com/execution/7|open in chordbeat>" in text

    [mail] = smtp.wait(1)
    message = mail.message
    assert mail.rcpt_tos == ("ops@example.com",) and message["From"] == "chordbeat@example.com"
    assert message["Subject"] == "[chordbeat] failed nightly-hr-sync" and message["X-Chordbeat-Alert-Id"] == key
    plain = message.get_body(("plain",))
    page = message.get_body(("html",))
    assert plain is not None and page is not None
    assert "boom" in plain.get_content() and "https://chordbeat.example.com/execution/7" in plain.get_content()
    assert 'href="https://chordbeat.example.com/execution/7"' in page.get_content()

    states = deliveries(settings, key)
    assert {c: (d.status, d.attempts, d.last_error) for c, d in states.items()} == {
        c: (DeliveryStatus.DELIVERED, 1, None) for c in ("hook", "chat", "mail")
    }


def test_a_failing_receiver_is_tried_again_later_and_counted(
    settings: Settings, wired: tuple[HttpReceiver, SmtpReceiver]
) -> None:
    http, _ = wired
    http.fail_next = 1
    key = alert(settings, ["hook"])
    before = clock.now()
    send(settings, "hook")
    failed = deliveries(settings, key)["hook"]
    assert failed.status is DeliveryStatus.PENDING and failed.attempts == 1 and failed.lease_until is None
    assert failed.last_error == f"HTTP 500 from http://127.0.0.1:{http.url.split(':')[2].split('/')[0]}/…: no"
    assert before + timedelta(seconds=4) <= failed.next_try_at <= clock.now() + timedelta(seconds=6)
    assert failures(settings, "hook") == 1
    send(settings, "hook")  # not due yet: nothing sent
    assert len(http.answered()) == 1

    with transaction(settings.database_url) as session:  # the backoff has passed
        session.execute(update(AlertDelivery).values(next_try_at=clock.now()))
    send(settings, "hook")
    [_, second] = http.wait(2, status=None)
    assert second.json()["id"] == key and second.signature_valid(SECRET)
    done = deliveries(settings, key)["hook"]
    assert (done.status, done.attempts, done.last_error) == (DeliveryStatus.DELIVERED, 2, None)
    assert failures(settings, "hook") == 1


def test_a_delivery_failing_past_the_retry_time_is_given_up_with_its_last_error(
    settings: Settings, wired: tuple[HttpReceiver, SmtpReceiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MAIL_URL", f"smtp://127.0.0.1:{free_port()}")  # nobody listens
    key = alert(settings, ["mail", "hook"], age_s=settings.alert_retry_for_s + 1)
    wired[0].fail_next = 1
    send(settings, "mail", "hook")
    states = deliveries(settings, key)
    assert states["mail"].status is DeliveryStatus.FAILED and states["hook"].status is DeliveryStatus.FAILED
    assert states["mail"].last_error is not None and "connection refused" in states["mail"].last_error
    assert states["mail"].last_error.startswith("smtp://127.0.0.1:")
    assert states["hook"].last_error is not None and states["hook"].last_error.startswith("HTTP 500 from")
    assert failures(settings, "mail") == 1 and failures(settings, "hook") == 1


def test_a_storm_reaches_a_channel_as_the_rate_limit_and_one_summary(
    settings: Settings, wired: tuple[HttpReceiver, SmtpReceiver]
) -> None:
    http, _ = wired
    keys = [alert(settings, ["hook"], execution_id=n) for n in range(8)]
    send(settings, "hook")
    got = http.wait(4)
    assert [r.json()["id"] for r in got[:3]] == keys[:3]
    summary = got[3].json()
    assert summary["kind"] == "summary" and summary["alerts"] == keys[3:] and got[3].signature_valid(SECRET)
    assert summary["message"].startswith("5 more alerts within a minute")
    assert summary["url"] == "https://chordbeat.example.com/alerts"
    status = [deliveries(settings, k)["hook"].status for k in keys]
    assert status == [DeliveryStatus.DELIVERED] * 3 + [DeliveryStatus.SUMMARISED] * 5

    later = alert(settings, ["hook"], execution_id=99)  # same minute: waits for room
    test = alert(settings, ["hook"], execution_id=100, kind="test")  # a test too (it counts: issue 36)
    send(settings, "hook")
    assert len(http.answered()) == 4
    for key in (later, test):
        assert deliveries(settings, key)["hook"].status is DeliveryStatus.PENDING
        assert deliveries(settings, key)["hook"].attempts == 0


def test_test_alerts_are_counted_by_the_rate_limit_and_carry_the_callers_text_as_a_test(
    app: ChordbeatCelery, settings: Settings, wired: tuple[HttpReceiver, SmtpReceiver]
) -> None:
    http, _ = wired
    lure = "URGENT: your chordbeat session expired, re-authenticate at https://evil.example/login " * 6
    calls = [
        wiring_checks.test_alert(app, "hook", actor="dave", reason=lure[:500]) for _ in range(settings.alert_rate_limit)
    ]
    # Past the channel's rate limit (3 a minute here), a test is refused, naming the field.
    with pytest.raises(InvalidArgument, match=r"^channel: 3 test alerts to hook in the last 60 s"):
        wiring_checks.test_alert(app, "hook", actor="dave", reason="one more")
    # A real alert and the tests share the window: the alert first, the tests with what is left.
    key = alert(settings, ["hook"])
    send(settings, "hook")
    got = http.wait(settings.alert_rate_limit)
    assert [r.json()["id"] for r in got] == [key, calls[0]["id"], calls[1]["id"]]
    send(settings, "hook")
    assert len(http.answered()) == settings.alert_rate_limit  # the third test waits for room
    # A test alert has no schedule: its link is the Alerts page, not "/schedule?name=" (no such page).
    assert got[1].json()["url"].endswith("/alerts?status=all"), got[1].json()
    message = got[1].json()["message"]
    assert message.startswith("TEST, not an alert: chordbeat test of channel hook, asked by dave (service)")
    assert len(message) <= 200 and message.count("URGENT") == 1 and message.endswith('…"')


def test_hostile_text_stays_in_its_place_and_huge_text_is_cut(
    settings: Settings, wired: tuple[HttpReceiver, SmtpReceiver]
) -> None:
    http, smtp = wired
    name = "evil\r\nBcc: victim@example.com\u2028X-Evil: 1"
    message = "<script>alert(1)</script> & " + "x" * 100_000
    key = alert(settings, ["mail", "chat", "hook"], schedule=name, message=message)
    send(settings, "mail", "chat", "hook")
    [mail] = smtp.wait(1)
    assert mail.rcpt_tos == ("ops@example.com",)
    parsed = mail.message
    assert parsed["Bcc"] is None and parsed["X-Evil"] is None
    assert parsed["Subject"] == "[chordbeat] failed evil Bcc: victim@example.com X-Evil: 1"
    page = parsed.get_body(("html",))
    assert page is not None and "<script>" not in page.get_content() and "&lt;script&gt;" in page.get_content()
    assert len(mail.raw) < 40_000
    chat = next(r for r in http.wait(2) if r.path == "/chat").json()["text"]
    assert len(chat) <= messages.SLACK_TEXT_CHARS and chat.endswith(messages.CUT_MARK)
    assert "<script>" not in chat and "&lt;script&gt;" in chat
    hook = next(r for r in http.answered() if r.path == "/hook").json()
    assert len(hook["message"]) <= messages.WEBHOOK_MESSAGE_CHARS and hook["id"] == key


def test_secrets_are_never_in_errors_or_logs(
    settings: Settings,
    wired: tuple[HttpReceiver, SmtpReceiver],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    http, _ = wired
    token = "T0KEN-in-the-path"
    monkeypatch.setenv("CHAT_URL", http.url.replace("/hook", f"/services/{token}?key={token}"))
    monkeypatch.setenv("MAIL_URL", f"smtp://alice:{token}@127.0.0.1:{free_port()}")
    monkeypatch.delenv("HOOK_SECRET")
    http.fail_next = 1
    caplog.set_level(logging.DEBUG)
    key = alert(settings, ["chat", "mail", "hook"])
    send(settings, "chat", "mail", "hook")
    states = deliveries(settings, key)
    errors = {c: d.last_error or "" for c, d in states.items()}
    assert errors["chat"].startswith("HTTP 500 from http://127.0.0.1:") and errors["chat"].endswith("/…: no")
    assert errors["mail"].startswith("smtp://127.0.0.1:")
    # Unsigned, a webhook would be refused by a careful receiver and trusted by a careless one.
    assert errors["hook"] == "HOOK_SECRET is not set (the webhook's signing secret)"
    assert [r.path for r in http.answered()] == [f"/services/{token}?key={token}"]
    for text in [*errors.values(), caplog.text]:
        assert token not in text and SECRET not in text


def _logged_text(record: logging.LogRecord) -> str:
    """All a handler could write of ``record``: message, arguments, traceback, stack."""
    formatter = logging.Formatter()
    parts = [str(record.msg), repr(record.args), record.getMessage(), record.exc_text or "", record.stack_info or ""]
    if record.exc_info:
        parts.append(formatter.formatException(record.exc_info))
    return "\n".join(parts)


def test_secrets_of_a_url_http_client_cannot_parse_are_in_no_log_record(
    settings: Settings,
    wired: tuple[HttpReceiver, SmtpReceiver],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # http.client refuses both (InvalidURL) with the password, or the token path, in its message.
    password, token = "PASSW0RD-of-the-hook", "T0KEN-of-the-chat"
    monkeypatch.setenv("HOOK_URL", f"http://alice:{password}@127.0.0.1/hook")  # no port: "nonnumeric port"
    monkeypatch.setenv("CHAT_URL", f"http://127.0.0.1:{free_port()}/services/{token} x")  # a space in the path
    caplog.set_level(logging.DEBUG)
    key = alert(settings, ["hook", "chat"])
    for _ in range(2):  # and at the retry
        send(settings, "hook", "chat")
        with transaction(settings.database_url) as session:
            session.execute(update(AlertDelivery).values(next_try_at=clock.now()))
    states = deliveries(settings, key)
    assert {c: d.attempts for c, d in states.items()} == {"hook": 2, "chat": 2}
    assert states["hook"].last_error == "http://127.0.0.1/…: not a usable URL (http.client refused it)"
    logged = [_logged_text(record) for record in caplog.records]
    assert logged  # the failures are logged...
    for text in [*logged, *(d.last_error or "" for d in states.values())]:
        assert password not in text and token not in text  # ...never their secrets


def test_an_exception_quoting_a_secret_the_sender_read_is_logged_masked(caplog: pytest.LogCaptureFixture) -> None:
    # Whatever raises (a library's error the transports do not know): the record is masked.
    password, token = "PASSW0RD-read-by-the-sender", "T0KEN-read-by-the-sender"
    remember(f"http://alice:{password}@hooks.example.com/services/{token}")
    caplog.set_level(logging.DEBUG)
    try:
        raise http.client.InvalidURL(f"nonnumeric port: '{password}@hooks.example.com' for /services/{token}")
    except http.client.InvalidURL:
        masked_logger("celeryapp.alerting.sender").exception("could not send to %s", f"/services/{token}")
    [record] = caplog.records
    assert "nonnumeric port" in _logged_text(record) and "could not send to" in caplog.text
    assert password not in _logged_text(record) + caplog.text and token not in _logged_text(record) + caplog.text


def test_without_a_channels_file_nothing_is_sent_or_counted_as_an_attempt(
    settings: Settings, wired: tuple[HttpReceiver, SmtpReceiver]
) -> None:
    key = alert(settings, ["hook"])
    assert Sender(dataclasses.replace(settings, alert_channels_file=None)).poll() == 0
    state = deliveries(settings, key)["hook"]
    assert (state.status, state.attempts, state.last_error) == (DeliveryStatus.PENDING, 0, None)


@pytest.mark.both_databases  # two senders' claims race: a compare-and-set
def test_a_claim_is_taken_once_and_a_dead_senders_claim_lapses(
    settings: Settings, wired: tuple[HttpReceiver, SmtpReceiver]
) -> None:
    http, _ = wired
    held, lapsed = alert(settings, ["hook"], execution_id=1), alert(settings, ["hook"], execution_id=2)
    now = clock.now()
    with transaction(settings.database_url) as session:  # claims of a sender that was killed sending
        for key, until in ((held, now + timedelta(seconds=60)), (lapsed, now - timedelta(seconds=1))):
            alert_id = session.scalar(select(Alert.id).where(Alert.key == key))
            session.execute(
                update(AlertDelivery).where(AlertDelivery.alert_id == alert_id).values(lease_until=until, attempts=1)
            )
    two = [Sender(settings), Sender(settings)]
    for sender in two:  # both at once: the compare-and-set lets one send it
        sender.poll()
    for sender in two:
        sender.close(30)
    assert [r.json()["id"] for r in http.wait(1)] == [lapsed]
    assert deliveries(settings, lapsed)["hook"].attempts == 2
    assert deliveries(settings, held)["hook"].status is DeliveryStatus.PENDING


@pytest.mark.slow  # waits for the stuck channel's send timeout (10 s)
def test_a_hanging_receiver_holds_up_no_other_channel(
    settings: Settings, wired: tuple[HttpReceiver, SmtpReceiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    http, smtp = wired
    with hanging_server() as url:
        monkeypatch.setenv("STUCK_URL", url)
        sender = Sender(settings)
        key = alert(settings, ["stuck", "mail", "hook"])
        assert sender.poll() == 3
        smtp.wait(1)
        http.wait(1)
        # Delivered while the stuck channel's send still waits for an answer (its own thread takes
        # its lease: on a loaded host, maybe only after the others were delivered).
        stuck = wait_for(
            lambda: (row := deliveries(settings, key)["stuck"]).lease_until is not None and row,
            10,
            interval=0.05,
            what="the stuck channel's lease",
        )
        assert stuck.last_error is None
        sender.close(30)
    state = deliveries(settings, key)["stuck"]
    assert state.status is DeliveryStatus.PENDING and state.last_error is not None and "no answer" in state.last_error
