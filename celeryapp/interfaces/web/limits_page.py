"""The dashboard's shared limits: the ``/limits`` page (each limit with its slots, what is in use,
who waits and the oldest waiter's age) and ``/limit?name=`` (its holders with their runs, its
waiters oldest first, the slots each key holds). Admins resize a limit there, with a reason, kept
in the audit trail as every action is; a resize never pre-empts a holder. Viewers only read."""

from __future__ import annotations

import asyncio
import functools
import logging
from datetime import datetime
from typing import Any
from urllib.parse import quote

import tornado.web

from celeryapp.domain.limits import MAX_NAME_CHARS
from celeryapp.domain.shared_limits import LIMIT_FIELDS, MAX_SLOTS
from celeryapp.domain.times import parse_time, span
from celeryapp.errors import ChordbeatError, FieldError, InvalidArgument, NotFound
from celeryapp.execution.limit_store import limit_detail, limit_summaries
from celeryapp.interfaces import limit_service
from celeryapp.interfaces.web.base import FLASH_COOKIE, BaseHandler
from celeryapp.states import AuditSource

logger = logging.getLogger(__name__)


def age(since: str | None, now: datetime) -> str:
    """How long since ``since`` (an oldest waiter's, a holder's): ``3 min 4 s``; ``-`` for none."""
    moment = parse_time(since)
    return "-" if moment is None else span(max(0.0, (now - moment).total_seconds()))


def definition_words(limit: dict[str, Any]) -> str:
    """The rest of a limit's definition in words: ``rate 60/min · key {payload.customer}, 2 per key``."""
    words = []
    if limit.get("rate"):
        words.append(f"rate {limit['rate']}")
    if limit.get("key"):
        per_key = f", {limit['per_key_slots']} per key" if limit.get("per_key_slots") else ""
        words.append(f"key {limit['key']}{per_key}")
    words.append("skips when full" if limit.get("on_full") == "skip" else "waits when full")
    if limit.get("max_wait") is not None:
        words.append(f"starved after {span(limit['max_wait'])}")
    return " · ".join(words)


class LimitsHandler(BaseHandler):
    @tornado.web.authenticated
    async def get(self) -> None:
        limits = await self.read(limit_summaries)
        self.page("limits.html", limits=limits, age=age, words=definition_words)


class LimitHandler(BaseHandler):
    """GET: a limit's page; POST (admins): resize it, with a reason."""

    def name(self, given: str | None) -> str:
        # No stored name is longer or holds NUL (which PostgreSQL refuses outright).
        if not given or len(given) > MAX_NAME_CHARS or "\x00" in given:
            raise tornado.web.HTTPError(404, reason="no such limit")
        return given

    async def detail(self, name: str) -> dict[str, Any]:
        try:
            return await self.read(limit_detail, name)
        except NotFound:
            raise tornado.web.HTTPError(404, reason="no such limit") from None

    def show(self, limit: dict[str, Any], **form: Any) -> None:
        self.page(
            "limit.html",
            l=limit,
            age=age,
            words=definition_words,
            max_slots=MAX_SLOTS,
            error=form.get("error"),
            typed_slots=form.get("slots", limit["slots"]),
            typed_reason=form.get("reason", ""),
        )

    @tornado.web.authenticated
    async def get(self) -> None:
        self.show(await self.detail(self.name(self.get_query_argument("name", None))))

    @tornado.web.authenticated
    async def post(self) -> None:
        if not self.user.may_act:
            raise tornado.web.HTTPError(403, reason="read-only users cannot act")
        name = self.name(self.get_body_argument("name", None))
        typed = self.get_body_argument("slots", "").strip()[:40]
        reason = self.get_body_argument("reason", "").strip() or None
        try:
            if reason is None:
                raise InvalidArgument("reason", "say why: a reason is required to resize a limit")
            message = await asyncio.get_running_loop().run_in_executor(
                None, functools.partial(self.resize, name, typed, reason)
            )
        except FieldError as exc:  # a definition's refusal is one too: the field is named
            self.set_status(400)
            self.show(await self.detail(name), error=str(exc), slots=typed, reason=reason or "")
            return
        except ChordbeatError as exc:
            message = f"resize refused: {exc}"
        logger.info("web: resize by %s: %s", self.user.name, message)
        self.set_signed_cookie(FLASH_COOKIE, message, expires_days=None, httponly=True, samesite="Strict")
        self.redirect(f"/limit?name={quote(name, safe='')}")

    def resize(self, name: str, typed: str, reason: str) -> str:
        if not typed.isascii() or not typed.isdigit():
            raise InvalidArgument("slots", f"must be a whole number from 1 to {MAX_SLOTS}, got {typed!r}")
        app = self.ctx.app
        current = limit_service.get_limit(app, name)
        definition = {field: current[field] for field in LIMIT_FIELDS if current.get(field) is not None}
        before, definition["slots"] = current["slots"], int(typed)
        # The version read: a change made meanwhile (another field) is refused, not overwritten.
        stored = limit_service.apply_limit(
            app,
            definition,
            actor=self.user.name,
            reason=reason,
            expected_version=current["version"],
            source=AuditSource.WEB,
        )
        return f"{name}: {before} → {stored['slots']} slots, {stored['in_use']} in use"
