"""An SMTP password never travels in clear: over ``smtp://`` the sender logs in only after
STARTTLS (the server's certificate verified), and does not log in at all to a server that does not
offer it. A real aiosmtpd server with a certificate made for the test by ``openssl``; it lets a
client log in without TLS, so the test sees what the client does, not what the server forbids."""

from __future__ import annotations

import dataclasses
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session

from celeryapp.alerting.sender import Sender, send_channel
from celeryapp.config import Settings
from models import DeliveryStatus
from tests.support import alert_wiring
from tests.support.alert_wiring import alert, deliveries
from tests.support.servers import free_port

settings = alert_wiring.settings
PASSWORD = "mail-relay-password"


@dataclasses.dataclass
class Relay:
    """What the server saw: each login (user, password, over TLS or not) and each message."""

    port: int
    logins: list[tuple[str, str, bool]] = dataclasses.field(default_factory=list)
    messages: int = 0
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def url(self, scheme: str = "smtp") -> str:
        return f"{scheme}://alice:{PASSWORD}@127.0.0.1:{self.port}"

    def authenticate(self, server: SMTP, session: Session, envelope: Envelope, mechanism: str, data: Any) -> AuthResult:
        assert isinstance(data, LoginPassword)
        with self.lock:
            self.logins.append((data.login.decode(), data.password.decode(), session.ssl is not None))
        return AuthResult(success=True)

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        with self.lock:
            self.messages += 1
        return "250 Message accepted for delivery"


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key (an EC key: made in milliseconds)."""
    where = tmp_path_factory.mktemp("tls")
    cert, key = where / "cert.pem", where / "key.pem"
    command = ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    command += ["-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1"]
    subprocess.run([*command, "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return cert, key


def _relay(tls: ssl.SSLContext | None) -> Iterator[Relay]:
    relay = Relay(port=free_port())
    controller = Controller(
        relay,
        hostname="127.0.0.1",
        port=relay.port,
        tls_context=tls,
        auth_require_tls=False,  # the server would allow it: the client must not do it
        authenticator=relay.authenticate,
    )
    controller.start()  # type: ignore[no-untyped-call]
    try:
        yield relay
    finally:
        controller.stop()  # type: ignore[no-untyped-call]


@pytest.fixture
def starttls_relay(certificate: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> Iterator[Relay]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*certificate)
    # The client trusts the test's certificate as a deployment trusts its private CA.
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate[0]))
    yield from _relay(context)


@pytest.fixture
def plain_relay() -> Iterator[Relay]:
    yield from _relay(None)


def _send(settings: Settings) -> None:
    loaded = Sender(settings).channels()
    assert loaded is not None
    send_channel(settings, "mail", loaded["mail"])


def test_the_password_is_sent_only_after_starttls(
    settings: Settings, starttls_relay: Relay, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MAIL_URL", starttls_relay.url())
    key = alert(settings, ["mail"])
    _send(settings)
    assert deliveries(settings, key)["mail"].status is DeliveryStatus.DELIVERED
    assert starttls_relay.logins == [("alice", PASSWORD, True)] and starttls_relay.messages == 1


def test_a_server_without_starttls_never_gets_the_password(
    settings: Settings, plain_relay: Relay, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MAIL_URL", plain_relay.url())
    key = alert(settings, ["mail"])
    _send(settings)
    state = deliveries(settings, key)["mail"]
    assert (state.status, state.last_error) == (
        DeliveryStatus.PENDING,
        f"smtp://127.0.0.1:{plain_relay.port} does not offer STARTTLS: the password is never sent in clear "
        "(use a server that offers it, or smtps://)",
    )
    assert plain_relay.logins == [] and plain_relay.messages == 0
