"""How a message leaves: an HTTP POST (webhooks, Slack) or SMTP (email).

Each call is bounded by :data:`SEND_TIMEOUT_S` per network operation and raises
:class:`SendFailed` with an error fit to store and show: the address masked (a Slack webhook's
path is its secret, a URL's user and query may be), never the secret, never the whole answer.
"""

from __future__ import annotations

import http.client
import smtplib
import ssl
import urllib.error
import urllib.request
from email.message import EmailMessage
from urllib.parse import unquote, urlsplit

from celeryapp.domain.redaction import hide_secrets

#: Seconds a connection, a write or a read may take before the attempt counts as failed.
SEND_TIMEOUT_S = 10.0
#: Characters of a receiver's answer kept in the error (Slack says ``invalid_payload``, say).
ANSWER_CHARS = 100
#: The ports of ``smtp://`` and ``smtps://`` URLs that give none.
SMTP_PORTS = {"smtp": 25, "smtps": 465}


class SendFailed(Exception):
    """An attempt that did not deliver; the message is safe to store and show."""


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


_OPENER = urllib.request.build_opener(_NoRedirect)


def post(url: str, body: bytes, headers: dict[str, str]) -> None:
    """POST ``body``; return on a 2xx answer, raise :class:`SendFailed` otherwise."""
    where = masked(url)
    request = urllib.request.Request(url, data=body, method="POST")
    request.add_header("Content-Type", "application/json")
    request.add_header("User-Agent", "chordbeat-alerts")
    for name, value in headers.items():
        request.add_header(name, value)
    try:
        with _OPENER.open(request, timeout=SEND_TIMEOUT_S) as response:
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


def send_mail(smtp_url: str, variable: str, message: EmailMessage) -> None:
    """Send ``message`` through the server of ``smtp://[user:pass@]host[:port]`` (or ``smtps://``);
    with a user or password, over ``smtp://`` only after STARTTLS."""
    try:
        parts = urlsplit(smtp_url)
        scheme, host, port = parts.scheme, parts.hostname, parts.port
    except ValueError:
        scheme, host, port = "", None, None
    if scheme not in SMTP_PORTS or not host:
        raise SendFailed(f"{variable} is not an smtp://[user:pass@]host:port or smtps:// URL")
    where = f"{scheme}://{host}:{port or SMTP_PORTS[scheme]}"
    try:
        if scheme == "smtps":
            server: smtplib.SMTP = smtplib.SMTP_SSL(
                host, port or SMTP_PORTS[scheme], timeout=SEND_TIMEOUT_S, context=ssl.create_default_context()
            )
        else:
            server = smtplib.SMTP(host, port or SMTP_PORTS[scheme], timeout=SEND_TIMEOUT_S)
        with server:
            if parts.username or parts.password:
                if scheme == "smtp":
                    _starttls(server, where)
                server.login(unquote(parts.username or ""), unquote(parts.password or ""))
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
