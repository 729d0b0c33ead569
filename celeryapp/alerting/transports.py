"""How a message leaves: an HTTP POST (webhooks, Slack) or SMTP (email).

Each call is bounded twice: by :data:`SEND_TIMEOUT_S` per network operation, and as a whole by
its deadline (``CHORDBEAT_ALERT_SEND_TIMEOUT``, :class:`Deadline`), so a receiver answering a byte
at a time cannot hold a channel for longer. It raises :class:`SendFailed` with an error fit to
store and show: the address masked (a Slack webhook's path is its secret, a URL's user and query
may be), never the secret, never the whole answer.
"""

from __future__ import annotations

import contextlib
import http.client
import smtplib
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from email.message import EmailMessage
from types import TracebackType
from typing import Any
from urllib.parse import unquote, urlsplit

from celeryapp.domain.redaction import hide_secrets
from celeryapp.errors import ChordbeatError
from celeryapp.variables import DEFAULT_ALERT_SEND_TIMEOUT_S

#: Seconds a connection, a write or a read may take before the attempt counts as failed.
SEND_TIMEOUT_S = 10.0
#: Name lookups run here, so a send waits for one no longer than its deadline (``getaddrinfo``
#: cannot be interrupted; a lookup given up on ends on the resolver's own timeouts).
_LOOKUPS = ThreadPoolExecutor(max_workers=8, thread_name_prefix="chordbeat-alert-dns")
#: Characters of a receiver's answer kept in the error (Slack says ``invalid_payload``, say).
ANSWER_CHARS = 100
#: The ports of ``smtp://`` and ``smtps://`` URLs that give none.
SMTP_PORTS = {"smtp": 25, "smtps": 465}


class SendFailed(ChordbeatError):
    """An attempt that did not deliver; the message is safe to store and show."""


class Deadline:
    """One send's overall deadline. Each socket operation already waits at most
    :data:`SEND_TIMEOUT_S`, which a receiver trickling its answer resets with every byte; so when
    the deadline passes, a timer shuts the send's connection down, and the read in progress ends
    at once (end of file, or an error, either reported as the deadline)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._ends = time.monotonic() + seconds
        self._lock = threading.Lock()
        self._expired = False
        # Duplicates of the send's sockets: shutting a duplicate down shuts the connection down,
        # whatever wraps the original (TLS takes the original's descriptor over).
        self._sockets: list[socket.socket] = []
        self._timer = threading.Timer(seconds, self._cut)
        self._timer.daemon = True

    def __enter__(self) -> Deadline:
        self._timer.start()
        return self

    def __exit__(self, *_: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._timer.cancel()
        with self._lock:
            for duplicate in self._sockets:
                duplicate.close()
            self._sockets.clear()

    @property
    def expired(self) -> bool:
        with self._lock:
            return self._expired or time.monotonic() >= self._ends

    def left(self) -> float:
        """Seconds left; :class:`TimeoutError` when none are."""
        left = self._ends - time.monotonic()
        if left <= 0:
            raise TimeoutError("the send's deadline passed")
        return left

    def operation_timeout(self) -> float:
        return min(SEND_TIMEOUT_S, self.left())

    def connect(
        self, address: tuple[str, int], timeout: float | None = None, source_address: Any = None
    ) -> socket.socket:
        """``socket.create_connection`` within the deadline: the lookup, then each address."""
        host, port = address
        lookup = _LOOKUPS.submit(socket.getaddrinfo, host, port, 0, socket.SOCK_STREAM)
        try:
            addresses = lookup.result(timeout=self.left())
        except FutureTimeout:
            raise TimeoutError(f"no address for {host} within the send's deadline") from None
        error: OSError = OSError(f"no address for {host}")
        for family, kind, proto, _, where in addresses:
            sock = socket.socket(family, kind, proto)
            try:
                sock.settimeout(self.operation_timeout())
                if source_address:
                    sock.bind(source_address)
                sock.connect(where)
                self._watch(sock)
                return sock
            except OSError as exc:
                sock.close()
                error = exc
        raise error

    def _watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock.dup())
            if self._expired:
                self._sockets[-1].shutdown(socket.SHUT_RDWR)

    def _cut(self) -> None:
        with self._lock:
            self._expired = True
            for duplicate in self._sockets:
                with contextlib.suppress(OSError):
                    duplicate.shutdown(socket.SHUT_RDWR)

    def failed(self, where: str) -> SendFailed:
        return SendFailed(f"no complete answer from {where} within {self.seconds:g} s (CHORDBEAT_ALERT_SEND_TIMEOUT)")


class _BoundedHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        deadline = self.deadline

        class Connection(http.client.HTTPConnection):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                self._create_connection = deadline.connect

        return self.do_open(Connection, req)


class _BoundedHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        deadline = self.deadline

        class Connection(http.client.HTTPSConnection):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                self._create_connection = deadline.connect

        return self.do_open(Connection, req)


class _BoundedSMTP(smtplib.SMTP):
    def __init__(self, deadline: Deadline, host: str, port: int) -> None:
        self.deadline = deadline
        super().__init__(host, port, timeout=deadline.operation_timeout())

    def _get_socket(self, host: str, port: int, timeout: float) -> socket.socket:
        return self.deadline.connect((host, port))


class _BoundedSMTPS(smtplib.SMTP_SSL):
    def __init__(self, deadline: Deadline, host: str, port: int) -> None:
        self.deadline, self.server_hostname = deadline, host
        super().__init__(host, port, timeout=deadline.operation_timeout(), context=ssl.create_default_context())

    def _get_socket(self, host: str, port: int, timeout: float) -> socket.socket:
        return self.context.wrap_socket(self.deadline.connect((host, port)), server_hostname=self.server_hostname)


def masked(url: str) -> str:
    """``https://hooks.example.com/…``: scheme, host and port only."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<an unusable URL>"
    rest = "/…" if parts.path.strip("/") or parts.query else ""
    return f"{parts.scheme}://{host}{port}{rest}"


def http_url(url: str, variable: str) -> str:
    """``url`` if it is an http(s) URL with a host; the error names ``variable``, not the value."""
    try:
        parts = urlsplit(url)
        usable = parts.scheme in {"http", "https"} and bool(parts.hostname)
    except ValueError:
        usable = False
    if not usable:
        raise SendFailed(f"{variable} is not an http:// or https:// URL")
    return url


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer other than 2xx: the sender retries, and the operator fixes the URL
    (a redirected POST would be resent as a GET, or to wherever the answer points)."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def post(url: str, body: bytes, headers: dict[str, str], *, deadline_s: float = DEFAULT_ALERT_SEND_TIMEOUT_S) -> None:
    """POST ``body``; return on a 2xx answer taken whole within ``deadline_s``, raise
    :class:`SendFailed` otherwise."""
    where = masked(url)
    with Deadline(deadline_s) as deadline:
        try:
            _post(url, body, headers, deadline)
        except SendFailed:
            if deadline.expired:
                raise deadline.failed(where) from None
            raise
        if deadline.expired:  # the answer was cut short: not taken whole
            raise deadline.failed(where)


def _post(url: str, body: bytes, headers: dict[str, str], deadline: Deadline) -> None:
    where = masked(url)
    opener = urllib.request.build_opener(_NoRedirect, _BoundedHTTPHandler(deadline), _BoundedHTTPSHandler(deadline))
    request = urllib.request.Request(url, data=body, method="POST")
    request.add_header("Content-Type", "application/json")
    request.add_header("User-Agent", "chordbeat-alerts")
    for name, value in headers.items():
        request.add_header(name, value)
    try:
        with opener.open(request, timeout=deadline.operation_timeout()) as response:
            response.read(ANSWER_CHARS)
    except urllib.error.HTTPError as exc:
        answer = _answer(exc.read(ANSWER_CHARS) if exc.fp is not None else b"")
        raise SendFailed(f"HTTP {exc.code} from {where}" + (f": {answer}" if answer else "")) from None
    except urllib.error.URLError as exc:
        raise SendFailed(f"{where}: {_reason(exc.reason)}") from None
    except TimeoutError:
        raise SendFailed(f"no answer from {where} within {SEND_TIMEOUT_S:g} s") from None
    except http.client.InvalidURL:
        # Its message quotes the URL's parts: "nonnumeric port: 'password@host'", a token path.
        raise SendFailed(f"{where}: not a usable URL (http.client refused it)") from None
    except http.client.HTTPException as exc:  # a malformed answer: its text is the receiver's
        raise SendFailed(f"{where}: {type(exc).__name__}") from None
    except (OSError, ValueError) as exc:
        raise SendFailed(f"{where}: {_reason(exc)}") from None


def send_mail(
    smtp_url: str, variable: str, message: EmailMessage, *, deadline_s: float = DEFAULT_ALERT_SEND_TIMEOUT_S
) -> None:
    """Send ``message`` through the server of ``smtp://[user:pass@]host[:port]`` (or ``smtps://``);
    with a user or password, over ``smtp://`` only after STARTTLS; all within ``deadline_s``."""
    try:
        parts = urlsplit(smtp_url)
        scheme, host, port = parts.scheme, parts.hostname, parts.port
    except ValueError:
        scheme, host, port = "", None, None
    if scheme not in SMTP_PORTS or not host:
        raise SendFailed(f"{variable} is not an smtp://[user:pass@]host:port or smtps:// URL")
    where = f"{scheme}://{host}:{port or SMTP_PORTS[scheme]}"
    with Deadline(deadline_s) as deadline:
        try:
            _send_mail(parts.username, parts.password, scheme, host, port or SMTP_PORTS[scheme], message, deadline)
        except SendFailed:
            if deadline.expired:
                raise deadline.failed(where) from None
            raise


def _send_mail(
    user: str | None, password: str | None, scheme: str, host: str, port: int, message: EmailMessage, deadline: Deadline
) -> None:
    where = f"{scheme}://{host}:{port}"
    try:
        server: smtplib.SMTP = (
            _BoundedSMTPS(deadline, host, port) if scheme == "smtps" else _BoundedSMTP(deadline, host, port)
        )
        with server:
            if user or password:
                if scheme == "smtp":
                    _starttls(server, where)
                server.login(unquote(user or ""), unquote(password or ""))
            # Recipients refused while others took it are not retried: a resend would reach
            # those who have it twice, and the refusal is the server's (a mistyped address).
            server.send_message(message)
    except smtplib.SMTPResponseException as exc:
        raise SendFailed(f"{where} answered {exc.smtp_code}: {_answer(exc.smtp_error)}") from None
    except smtplib.SMTPRecipientsRefused as exc:
        raise SendFailed(f"{where} refused every recipient ({len(exc.recipients)})") from None
    except TimeoutError:
        raise SendFailed(f"no answer from {where} within {SEND_TIMEOUT_S:g} s") from None
    except (smtplib.SMTPException, OSError) as exc:
        raise SendFailed(f"{where}: {_reason(exc)}") from None


def _starttls(server: smtplib.SMTP, where: str) -> None:
    """Encrypt the connection before a login: over ``smtp://`` the password would go in clear,
    readable on every network between. The server's certificate is verified (a private CA:
    ``SSL_CERT_FILE``); a server that does not offer STARTTLS never gets the password."""
    server.ehlo()
    if not server.has_extn("starttls"):
        raise SendFailed(
            f"{where} does not offer STARTTLS: the password is never sent in clear "
            "(use a server that offers it, or smtps://)"
        )
    server.starttls(context=ssl.create_default_context())
    server.ehlo()


def _reason(reason: object) -> str:
    if isinstance(reason, TimeoutError):
        return f"no answer within {SEND_TIMEOUT_S:g} s"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror.lower()
    return _answer(str(reason) or type(reason).__name__)


def _answer(raw: bytes | str) -> str:
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    # A receiver's answer is shown to operators: one short line, URLs' passwords hidden.
    return hide_secrets(" ".join(text.split()))[:ANSWER_CHARS]
