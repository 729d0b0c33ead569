"""The alert sender's log records with the channels' secrets masked, whatever raised.

The sender reads secrets from the channels' variables (webhook and Slack URLs, whose path may be
a token; SMTP URLs with a password; signing keys) and hands them to urllib, http.client and
smtplib, whose exceptions may quote them: ``InvalidURL("nonnumeric port: 'password@host'")``.
Such an exception is logged with its traceback, at every retry, by the worker running the sender.
So each secret is remembered by value as it is read (:func:`remember`), and a filter on the
alerting loggers replaces it in each record's message, arguments, traceback and stack before any
handler sees the record."""

from __future__ import annotations

import logging
import threading

from celeryapp.domain.redaction import hide_values, url_secrets

_lock = threading.Lock()
#: The secrets read so far, by value (as many as the channels' variables hold: a few).
_secrets: frozenset[str] = frozenset()


def remember(value: str, *, url: bool = True) -> str:
    """Mask ``value`` (and, for a URL, its secret parts) in the alerting logs from now on; answer it."""
    global _secrets
    pieces = url_secrets(value) if url else {value}
    if not pieces <= _secrets:
        with _lock:
            _secrets = _secrets | pieces
    return value


def masked(text: str) -> str:
    """``text`` with the remembered secrets and any URL password or ``password=`` value hidden."""
    return hide_values(text, _secrets)


class SecretMasking(logging.Filter):
    """Rewrites each record it sees into masked text: message formatted then masked (no
    arguments left), traceback and stack formatted then masked (no exception object left for a
    handler to format again)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # arguments that do not fit the format: keep both, as text
            message = f"{record.msg!s} {record.args!r}"
        record.msg, record.args = masked(message), ()
        if record.exc_info:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
        if record.exc_text:
            record.exc_text = masked(record.exc_text)
        if record.stack_info:
            record.stack_info = masked(record.stack_info)
        return True


def masked_logger(name: str) -> logging.Logger:
    """The logger ``name`` with :class:`SecretMasking` on it (a filter acts on the records of its
    own logger only, so each alerting module takes its logger from here)."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, SecretMasking) for f in logger.filters):
        logger.addFilter(SecretMasking())
    return logger
