"""What each kind of channel receives for an alert: the webhook's signed JSON, Slack's text, the email.

An alert's message holds text chordbeat does not control (a step's error, a schedule's name), so
each format bounds it (a pager, a chat and a mailbox each have their own idea of "too long") and
escapes it for where it goes: JSON-encoded, Slack's ``&<>`` escaped, HTML-escaped in the email's
HTML part, and a subject with no line breaks or control characters (which would start new headers).
"""

from __future__ import annotations

import hashlib
import hmac
import html
import json
from dataclasses import dataclass
from datetime import datetime
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from typing import Any
from urllib.parse import quote

from celeryapp.domain.times import iso

#: The longest ``message`` a webhook body carries (the outbox keeps at most as much).
WEBHOOK_MESSAGE_CHARS = 4000
#: The longest Slack text: Slack cuts (and its clients fold) far earlier than its 40,000 limit.
SLACK_TEXT_CHARS = 3000
#: The longest email subject: mail clients show about this much, and RFC 5322 lines stay short.
SUBJECT_CHARS = 150
#: The longest message in an email's body.
EMAIL_MESSAGE_CHARS = 4000
#: Alerts a summary names one by one; it counts the rest.
SUMMARY_LISTED = 20
#: What marks a cut text.
CUT_MARK = " …(cut)"
#: The kind of a summary message (not an alert kind: it stands for several alerts).
SUMMARY_KIND = "summary"
#: A webhook's headers: the time it was signed (whole seconds since the epoch, the reference
#: clock's), the signature of that time and the body, and the contract's body-only signature.
TIMESTAMP_HEADER = "X-Chordbeat-Timestamp"
SIGNATURE_V2_HEADER = "X-Chordbeat-Signature-V2"
SIGNATURE_HEADER = "X-Chordbeat-Signature"
#: Seconds either side of its own clock within which a receiver takes a timestamp (docs/alerts.md);
#: each attempt is signed anew, so a retry is never older than this.
REPLAY_WINDOW_S = 300


@dataclass(frozen=True)
class AlertText:
    """One alert as the channels describe it (from its outbox row)."""

    key: str
    kind: str
    schedule_name: str
    message: str
    at: datetime
    detail: str | None = None
    slot_at: datetime | None = None
    execution_id: int | None = None
    expected_at: datetime | None = None


def cut(text: str, limit: int) -> str:
    """``text`` at most ``limit`` characters, marked when cut."""
    return text if len(text) <= limit else text[: max(limit - len(CUT_MARK), 0)] + CUT_MARK


def link(alert: AlertText, dashboard_url: str | None) -> str | None:
    """The dashboard page about the alert (its run, else its schedule, else, for a channel's test
    alert, which has neither, the Alerts page); None without a dashboard."""
    if dashboard_url is None:
        return None
    if alert.execution_id is not None:
        return f"{dashboard_url}/execution/{alert.execution_id}"
    if not alert.schedule_name:  # "/schedule?name=" led to a "no such schedule" page
        return f"{dashboard_url}/alerts?status=all"
    return f"{dashboard_url}/schedule?name={quote(alert.schedule_name, safe='')}"


def title(alert: AlertText) -> str:
    """``failed nightly-hr-sync`` or ``late (finish) nightly-hr-sync``: kind and schedule."""
    kind = f"{alert.kind} ({alert.detail})" if alert.detail else alert.kind
    return f"{kind} {alert.schedule_name}"


def webhook_body(alert: AlertText, dashboard_url: str | None) -> bytes:
    """The webhook's JSON: the contract's fields, then ``detail``, ``expected_at`` and ``url``."""
    body = {
        "id": alert.key,
        "kind": alert.kind,
        "schedule": alert.schedule_name,
        "slot": iso(alert.slot_at),
        "execution_id": alert.execution_id,
        "message": cut(alert.message, WEBHOOK_MESSAGE_CHARS),
        "at": iso(alert.at),
        "detail": alert.detail,
        "expected_at": iso(alert.expected_at),
        "url": link(alert, dashboard_url),
    }
    return _json(body)


def signature(body: bytes, secret: str) -> str:
    """``X-Chordbeat-Signature``: ``sha256=`` and the hex HMAC-SHA256 of the raw body (the
    contract's; replayable, kept for receivers that check only it)."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def timestamped_signature(timestamp: int, body: bytes, secret: str) -> str:
    """``X-Chordbeat-Signature-V2``: ``sha256=`` and the hex HMAC-SHA256 of ``<timestamp>.<raw body>``,
    ``timestamp`` being :data:`TIMESTAMP_HEADER`'s value. Signed together, a receiver that refuses
    timestamps older than :data:`REPLAY_WINDOW_S` refuses a delivery replayed later."""
    return "sha256=" + hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def slack_body(alert: AlertText, dashboard_url: str | None) -> bytes:
    """Slack's ``{"text": ...}``: what happened, when, and a link to the dashboard."""
    lines = [f"*[chordbeat] {_slack(title(alert))}*", _slack(alert.message)]
    if alert.expected_at is not None:
        lines.append(f"expected to finish at {iso(alert.expected_at, timespec='seconds')}")
    where = link(alert, dashboard_url)
    if where is not None:
        lines.append(f"<{_slack(where)}|open in chordbeat>")
    lines.append(f"id `{_slack(alert.key)}`")
    return _json({"text": cut("\n".join(lines), SLACK_TEXT_CHARS)})


def subject(alert: AlertText) -> str:
    """``[chordbeat] <kind> <schedule>``, on one line whatever the schedule's name holds."""
    return cut(_one_line(f"[chordbeat] {alert.kind} {alert.schedule_name}"), SUBJECT_CHARS)


def email(alert: AlertText, *, sender: str, to: tuple[str, ...], dashboard_url: str | None) -> EmailMessage:
    """One message: plain text, and the same as HTML for clients that show that."""
    where = link(alert, dashboard_url)
    facts = _facts(alert)
    text = cut(alert.message, EMAIL_MESSAGE_CHARS)
    lines = [text, "", *(f"{name}: {value}" for name, value in facts)]
    plain = "\n".join([*lines, f"open: {where}"] if where else lines)
    rows = "".join(f"<tr><th align=left>{html.escape(n)}</th><td>{html.escape(v)}</td></tr>" for n, v in facts)
    anchor = f'<p><a href="{html.escape(where)}">open in chordbeat</a></p>' if where else ""
    page = f"<html><body><p>{html.escape(text)}</p><table>{rows}</table>{anchor}</body></html>"
    return _email(subject(alert), plain, page, sender=sender, to=to, key=alert.key)


def summary_text(alerts: list[AlertText]) -> str:
    """The message of a summary: how many alerts the rate limit held back, and which."""
    lines = [f"{len(alerts)} more alerts within a minute (rate limit): listed on the dashboard's alerts page"]
    lines += [f"- {title(a)}: {cut(_one_line(a.message), 200)} [{a.key}]" for a in alerts[:SUMMARY_LISTED]]
    if len(alerts) > SUMMARY_LISTED:
        lines.append(f"… and {len(alerts) - SUMMARY_LISTED} more")
    return "\n".join(lines)


def summary_webhook_body(key: str, alerts: list[AlertText], now: datetime, dashboard_url: str | None) -> bytes:
    """A summary for a webhook: kind ``summary``, the alerts' ids in ``alerts``."""
    body: dict[str, Any] = {
        "id": key,
        "kind": SUMMARY_KIND,
        "schedule": None,
        "slot": None,
        "execution_id": None,
        "message": cut(summary_text(alerts), WEBHOOK_MESSAGE_CHARS),
        "at": iso(now),
        "detail": None,
        "expected_at": None,
        "url": f"{dashboard_url}/alerts" if dashboard_url else None,
        "alerts": [a.key for a in alerts],
    }
    return _json(body)


def summary_slack_body(alerts: list[AlertText], dashboard_url: str | None) -> bytes:
    text = f"*[chordbeat] {len(alerts)} more alerts*\n{_slack(summary_text(alerts))}"
    if dashboard_url:
        text += f"\n<{_slack(dashboard_url)}/alerts|open in chordbeat>"
    return _json({"text": cut(text, SLACK_TEXT_CHARS)})


def summary_email(
    key: str, alerts: list[AlertText], *, sender: str, to: tuple[str, ...], dashboard_url: str | None
) -> EmailMessage:
    text = cut(summary_text(alerts), EMAIL_MESSAGE_CHARS)
    where = f"{dashboard_url}/alerts" if dashboard_url else None
    plain = text + (f"\n\nopen: {where}" if where else "")
    anchor = f'<p><a href="{html.escape(where)}">open in chordbeat</a></p>' if where else ""
    page = f"<html><body><pre>{html.escape(text)}</pre>{anchor}</body></html>"
    return _email(f"[chordbeat] {len(alerts)} more alerts", plain, page, sender=sender, to=to, key=key)


def _facts(alert: AlertText) -> list[tuple[str, str]]:
    facts = [("id", alert.key), ("kind", alert.kind), ("schedule", alert.schedule_name)]
    optional = [
        ("detail", alert.detail),
        ("slot", iso(alert.slot_at, timespec="seconds")),
        ("run", None if alert.execution_id is None else str(alert.execution_id)),
        ("expected to finish", iso(alert.expected_at, timespec="seconds")),
    ]
    facts += [(name, value) for name, value in optional if value is not None]
    facts.append(("decided at", iso(alert.at, timespec="seconds") or ""))
    return [(name, _one_line(value)) for name, value in facts]


def _email(subject_line: str, plain: str, page: str, *, sender: str, to: tuple[str, ...], key: str) -> EmailMessage:
    message = EmailMessage()
    message["Subject"] = subject_line
    message["From"] = sender
    message["To"] = ", ".join(to)
    message["Date"] = formatdate(localtime=False, usegmt=True)
    message["Message-ID"] = make_msgid(domain=sender.rpartition("@")[2] or None)
    # Receivers de-duplicate a delivery tried twice (at least once) on the alert's stable id.
    message["X-Chordbeat-Alert-Id"] = _one_line(key)
    message.set_content(plain)
    message.add_alternative(page, subtype="html")
    return message


def _one_line(text: str) -> str:
    """``text`` with each run of unprintable characters one space: controls could end a header
    line (CR, LF, and the line separators some clients break at), format characters (a
    right-to-left override) could disguise what a line says."""
    kept: list[str] = []
    for char in text:
        if char.isprintable():
            kept.append(char)
        elif not kept or kept[-1] != "\0":
            kept.append("\0")
    return "".join(kept).replace("\0", " ").strip()


def _slack(text: str) -> str:
    """Slack's escaping: ``&``, ``<`` and ``>`` (which would make links and mentions)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
