"""The alert channels' URLs and secrets kept out of a worker's pool children.

A worker that consumes the control queue sends alerts from its main process, which must have the
variables the channels file names (``url_env``, ``secret_env``, ``smtp_url_env``, and
``CHORDBEAT_SMTP_URL``). When it also runs steps (``make run``'s single worker, a small
deployment), its prefork children are forked from that process and would inherit them, so step
code could read a pager's URL or a webhook's signing key from ``os.environ`` and pass it to the
programs it starts. Each child removes them as it starts; the main process keeps them.

This hides them from step code that reads its environment; it is no boundary against step code
set on finding them (``/proc/<worker>/environ`` of the same user still lists them). Where steps
must not reach them, run steps in workers that are not given them (docs/alerts.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

from celery.signals import worker_init, worker_process_init

from celeryapp.alerting.channels import DEFAULT_SMTP_URL_ENV, load_channels
from celeryapp.errors import ConfigError
from celeryapp.runtime import Runtime

logger = logging.getLogger(__name__)

#: The variables the channels file named when the worker started, read before the pool forks: a
#: child started after the file was broken still removes them.
_named_at_start: frozenset[str] = frozenset({DEFAULT_SMTP_URL_ENV})
#: The worker's channels file (``CHORDBEAT_ALERT_CHANNELS``), read again by each child as it starts.
_channels_file: str | None = None


def channel_variables(path: str | None) -> frozenset[str]:
    """The environment variables holding the channels' URLs and secrets, by the file at ``path``."""
    names = {DEFAULT_SMTP_URL_ENV}
    for channel in load_channels(path).values():
        names.update(n for n in (channel.url_env, channel.secret_env, channel.smtp_url_env) if n)
    return frozenset(names)


def remember_channel_variables(sender: Any = None, **_: Any) -> None:
    """In the worker's main process, before the pool forks."""
    global _named_at_start, _channels_file
    if sender is None:
        return
    app: Runtime = sender.app
    _channels_file = app.settings.alert_channels_file
    try:
        _named_at_start = channel_variables(_channels_file)
    except ConfigError as exc:
        # The sender says the same and waits for a good file; the children still drop the default.
        logger.error("the channels' variables cannot be read for the pool children: %s", exc)


def hide_channel_variables(**_: Any) -> None:
    """In a pool child: drop the channels' variables from its environment (and so from programs
    its steps start), those named at the worker's start and those the file names now."""
    names = set(_named_at_start)
    with contextlib.suppress(ConfigError):  # said by the main process at start, and by the sender
        names |= channel_variables(_channels_file)
    hidden = sorted(name for name in names if os.environ.pop(name, None) is not None)
    if hidden:
        logger.debug("pool child %d: %s removed from its environment", os.getpid(), ", ".join(hidden))


def connect() -> None:
    """Wire both into this process's workers (once, whatever the number of apps created)."""
    worker_init.connect(remember_channel_variables, weak=False, dispatch_uid=f"{__name__}.remember")
    worker_process_init.connect(hide_channel_variables, weak=False, dispatch_uid=f"{__name__}.hide")
