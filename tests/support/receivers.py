"""Real receivers of alerts for the tests: an HTTP server (webhooks, Slack) and an SMTP server.

Both listen on a free loopback port in a thread of the test process and record what they get, so
a test sees what a pager or a mailbox would. Use them as fixtures: ``http_receiver`` and
``smtp_receiver`` (import them into a test module, or from conftest).
"""

from __future__ import annotations

import email
import email.policy
import hashlib
import hmac
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session

from tests.support.servers import free_port, wait_for


@dataclass(frozen=True)
class Request:
    """One request as the receiver got it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    #: ``time.time()`` when the whole body had been read.
    received_at: float
    #: The status the receiver answered.
    status: int

    def json(self) -> Any:
        return json.loads(self.body)

    def signature_valid(self, secret: str) -> bool:
        """Whether ``X-Chordbeat-Signature`` is ``sha256=`` the HMAC-SHA256 of the raw body with ``secret``."""
        expected = "sha256=" + hmac.new(secret.encode(), self.body, hashlib.sha256).hexdigest()
        return hmac.compare_digest(self.headers.get("x-chordbeat-signature", ""), expected)

    def timestamped_signature_valid(self, secret: str, now: float | None = None) -> bool:
        """docs/alerts.md's check: the V2 signature over the timestamp and the body, the timestamp
        within the replay window of ``now``."""
        return from_chordbeat(self.headers, self.body, secret, time.time() if now is None else now)


#: The replay window docs/alerts.md gives receivers, in seconds.
REPLAY_WINDOW_S = 300


def from_chordbeat(headers: dict[str, str], body: bytes, secret: str, now: float) -> bool:
    """What docs/alerts.md tells a receiver to check (headers keyed in lower case)."""
    timestamp = headers.get("x-chordbeat-timestamp", "")
    if not timestamp.isascii() or not timestamp.isdigit() or abs(now - int(timestamp)) > REPLAY_WINDOW_S:
        return False
    signed = timestamp.encode() + b"." + body
    expected = "sha256=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return hmac.compare_digest(headers.get("x-chordbeat-signature-v2", ""), expected)


@dataclass
class HttpReceiver:
    """The recorded requests, and how the next ones are answered."""

    url: str
    requests: list[Request] = field(default_factory=list)
    #: Answer 500 to this many more requests (then 200).
    fail_next: int = 0
    #: While set, requests are held unanswered (a receiver that hangs) until :meth:`release`.
    hang: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    released: threading.Event = field(default_factory=threading.Event)
    #: When set, requests are checked as docs/alerts.md says and answered 401 when they fail it.
    secret: str | None = None
    #: Seconds this receiver's clock is ahead of the test's (a replay "later").
    clock_offset_s: float = 0.0
    #: When set, the answer's body is this long and sent one byte per ``trickle_s`` seconds.
    trickle_bytes: int = 0
    trickle_s: float = 1.0

    def answered(self, status: int | None = None) -> list[Request]:
        with self.lock:
            return [r for r in self.requests if status is None or r.status == status]

    def release(self) -> None:
        self.hang = False
        self.released.set()

    def wait(self, count: int = 1, *, status: int | None = 200, timeout: float = 30.0) -> list[Request]:
        """The requests, once at least ``count`` were answered ``status`` (any when None)."""
        wait_for(lambda: len(self.answered(status)) >= count, timeout=timeout, what=f"{count} requests")
        return self.answered(status)


def _handler(receiver: HttpReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            at = time.time()
            if receiver.hang:
                # Held until released (or the server closes): the sender's timeout is what ends it.
                receiver.released.wait(timeout=600)
            headers = {k.lower(): v for k, v in self.headers.items()}
            with receiver.lock:
                status = 500 if receiver.fail_next > 0 else 200
                receiver.fail_next = max(0, receiver.fail_next - 1)
                if receiver.secret is not None and not from_chordbeat(
                    headers, body, receiver.secret, time.time() + receiver.clock_offset_s
                ):
                    status = 401
                receiver.requests.append(Request(self.command, self.path, headers, body, at, status))
            try:
                if receiver.trickle_bytes:
                    self._trickle(status)
                    return
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok" if status == 200 else b"no")
            except OSError:
                pass  # the sender gave up waiting and closed

        def _trickle(self, status: int) -> None:
            """The status line, then the rest of the answer one byte at a time (a slow receiver)."""
            self.wfile.write(f"HTTP/1.1 {status} OK\r\n".encode())
            self.wfile.flush()
            rest = f"Content-Length: {receiver.trickle_bytes}\r\n\r\n".encode() + b"k" * receiver.trickle_bytes
            for index in range(len(rest)):
                # The pace is the receiver's behaviour under test, not a wait for a condition.
                if receiver.released.wait(receiver.trickle_s):
                    return
                self.wfile.write(rest[index : index + 1])
                self.wfile.flush()

        do_PUT = do_POST

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def http_receiver() -> Iterator[HttpReceiver]:
    """An HTTP server on a free loopback port recording each request."""
    with serve_http_receiver() as receiver:
        yield receiver


@contextmanager
def serve_http_receiver() -> Iterator[HttpReceiver]:
    """:func:`http_receiver` outside pytest (the benchmark's receiver)."""
    port = free_port()
    receiver = HttpReceiver(url=f"http://127.0.0.1:{port}/hook")
    server = ThreadingHTTPServer(("127.0.0.1", port), _handler(receiver))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="http-receiver", daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver.release()
        server.shutdown()
        server.server_close()


@dataclass(frozen=True)
class Mail:
    """One message as the SMTP server got it."""

    mail_from: str
    rcpt_tos: tuple[str, ...]
    raw: bytes
    received_at: float

    @property
    def message(self) -> EmailMessage:
        parsed = email.message_from_bytes(self.raw, policy=email.policy.default)
        assert isinstance(parsed, EmailMessage)
        return parsed


@dataclass
class SmtpReceiver:
    host: str
    port: int
    messages: list[Mail] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"smtp://{self.host}:{self.port}"

    def received(self) -> list[Mail]:
        with self.lock:
            return list(self.messages)

    def wait(self, count: int = 1, *, timeout: float = 30.0) -> list[Mail]:
        wait_for(lambda: len(self.received()) >= count, timeout=timeout, what=f"{count} emails")
        return self.received()


class _Recorder:
    def __init__(self, receiver: SmtpReceiver) -> None:
        self.receiver = receiver

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        content = envelope.original_content or b""
        mail = Mail(str(envelope.mail_from), tuple(envelope.rcpt_tos), bytes(content), time.time())
        with self.receiver.lock:
            self.receiver.messages.append(mail)
        return "250 Message accepted for delivery"


@pytest.fixture
def smtp_receiver() -> Iterator[SmtpReceiver]:
    """aiosmtpd's SMTP server on a free loopback port recording each message (no TLS, no login)."""
    receiver = SmtpReceiver(host="127.0.0.1", port=free_port())
    controller = Controller(_Recorder(receiver), hostname=receiver.host, port=receiver.port)
    controller.start()  # type: ignore[no-untyped-call]
    try:
        yield receiver
    finally:
        controller.stop()  # type: ignore[no-untyped-call]


@contextmanager
def trickling_smtp_server(pace_s: float = 1.0) -> Iterator[str]:
    """An SMTP server that greets one byte every ``pace_s`` seconds, for ever (a slow receiver);
    its ``smtp://`` URL. Each greeting line is short, so no per-read timeout ever fires."""
    stop = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)

    def greet(connection: socket.socket) -> None:
        with connection:
            line = b"220-slow.example ESMTP\r\n"
            while True:
                for index in range(len(line)):
                    # The pace is the receiver's behaviour under test, not a wait for a condition.
                    if stop.wait(pace_s):
                        return
                    try:
                        connection.sendall(line[index : index + 1])
                    except OSError:
                        return

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=greet, args=(connection,), daemon=True).start()

    thread = threading.Thread(target=serve, name="trickling-smtp", daemon=True)
    thread.start()
    try:
        yield f"smtp://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()
