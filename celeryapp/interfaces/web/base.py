"""What every dashboard handler shares: the context, security headers, the login check,
read-only database reads off the event loop, templates' helpers, flash messages and error pages."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import quote, urlencode

from celeryapp.application import ChordbeatCelery
from celeryapp.domain.times import iso, parse_time, span
from celeryapp.interfaces import time_words
from celeryapp.interfaces.web import humanize
from celeryapp.interfaces.web.auth import WebUser
from celeryapp.interfaces.web.broker_state import WorkerPings
from celeryapp.interfaces.web.guard import LoginGuard
from celeryapp.interfaces.web.sessions import SessionCookies, Sessions
from models import transaction, utcnow

FLASH_COOKIE = "chordbeat_flash"
#: Scripts and styles only from here; nothing framed; no referrer leaves.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
T = TypeVar("T")


@dataclass
class WebContext:
    app: ChordbeatCelery
    users: dict[str, WebUser]
    #: ``CHORDBEAT_WEB_SECRET``: signs the cookies and the session records.
    secret: str
    #: The workers' last answers to a ping, this server's own.
    pings: WorkerPings = field(default_factory=WorkerPings)
    #: Who is logged in (web/sessions.py).
    sessions: Sessions = field(init=False)
    #: What a login may try (web/guard.py).
    guard: LoginGuard = field(init=False)

    def __post_init__(self) -> None:
        self.sessions = Sessions(self.app.settings, self.users, self.secret)
        self.guard = LoginGuard(self.app.settings, self.users)


def iso_seconds(value: datetime | None) -> str:
    """The dashboard's instants for machines (``<time datetime>``, titles): to the second."""
    return iso(value, timespec="seconds") or ""


class BaseHandler(SessionCookies):
    ctx: WebContext

    def initialize(self, ctx: WebContext) -> None:
        self.ctx = ctx
        self.sessions = ctx.sessions

    def set_default_headers(self) -> None:
        for name, value in SECURITY_HEADERS.items():
            self.set_header(name, value)

    async def prepare(self) -> None:
        # The session is kept in Redis: looked up off the event loop, so a Redis that hangs holds
        # the requests that need a session, not every page and the health check with them.
        self.current_user = await asyncio.get_running_loop().run_in_executor(None, self.sessions.current_user, self)

    def get_current_user(self) -> WebUser | None:
        return self.sessions.current_user(self)

    @property
    def user(self) -> WebUser:
        user = self.current_user
        assert isinstance(user, WebUser)  # pages are @authenticated
        return user

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(session, *args)`` in a read-only transaction, off the event loop."""

        def run() -> T:
            with transaction(self.ctx.app.settings.database_url, read_only=True) as session:
                return fn(session, *args)

        return await asyncio.get_running_loop().run_in_executor(None, run)

    def get_template_namespace(self) -> dict[str, Any]:
        namespace = super().get_template_namespace()
        namespace.update(
            flash=None,
            h=humanize,
            times=time_words,
            parse_time=parse_time,
            span=span,
            iso=iso_seconds,
            now=utcnow(),
            quote=quote,
            urlencode=urlencode,
        )
        return namespace

    def take_flash(self) -> str | None:
        raw = self.get_signed_cookie(FLASH_COOKIE, max_age_days=1)
        if raw is not None:
            self.clear_cookie(FLASH_COOKIE)
        return None if raw is None else raw.decode("utf-8", "replace")

    def page(self, template: str, **kwargs: Any) -> None:
        self.render(template, user=self.user, flash=self.take_flash(), **kwargs)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        self.render("error.html", status_code=status_code, reason=self._reason, user=self.current_user)
