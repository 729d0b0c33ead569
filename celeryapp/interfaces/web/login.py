"""The login and logout pages (what a login may try and how: web/guard.py; sessions: web/sessions.py)."""

from __future__ import annotations

import asyncio
import logging

import redis

from celeryapp.interfaces.web.base import BaseHandler
from celeryapp.interfaces.web.guard import failure_pad_s
from celeryapp.interfaces.web.hashing import PoolFull
from celeryapp.interfaces.web.redirects import same_site_path
from celeryapp.interfaces.web.throttle import Refusal

logger = logging.getLogger(__name__)
#: Characters of a user name or password looked at (a longer password only costs hashing time).
MAX_LOGIN_CHARS = 1024


class LoginHandler(BaseHandler):
    def get(self) -> None:
        self.render("login.html", error=None, next=self._next(), user=None)

    async def post(self) -> None:
        name = self.get_body_argument("username", "")[:MAX_LOGIN_CHARS]
        password = self.get_body_argument("password", "")[:MAX_LOGIN_CHARS]
        address = self.client_address
        guard = self.ctx.guard
        # Redis is asked off the event loop throughout: one that hangs holds this login, not the
        # dashboard (a handler's methods run one at a time, so the thread it runs in does not matter).
        loop = asyncio.get_running_loop()
        try:
            refusal = await loop.run_in_executor(None, guard.admit, name, address)
            if refusal is not None:
                await guard.refused(name, address, refusal)
                self._too_many(refusal)
                return
            user = await guard.check(name, password, address)
            if user is None:
                await asyncio.sleep(failure_pad_s(self.request.request_time()))
                self._again(401, "Wrong user name or password.")
                return
            await loop.run_in_executor(None, self.sessions.start, self, user)
        except PoolFull:
            self._too_many(Refusal("busy", 1, newly=False))
            return
        except redis.RedisError as exc:
            logger.error("web: login impossible, Redis does not answer: %s", exc)
            self._again(503, "Logins are unavailable: the dashboard cannot reach Redis.")
            return
        logger.info("web: %s logged in from %s", user.name, address)
        self.redirect(self._next())

    def _too_many(self, refusal: Refusal) -> None:
        self.set_header("Retry-After", str(refusal.retry_after_s))
        minutes = -(-refusal.retry_after_s // 60)
        self._again(429, f"Too many login attempts. Try again in {minutes} min.")

    def _again(self, status: int, error: str) -> None:
        self.set_status(status)
        self.render("login.html", error=error, next=self._next(), user=None)

    def _next(self) -> str:
        return same_site_path(self.get_argument("next", "/"))


class LogoutHandler(BaseHandler):
    async def post(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.sessions.end, self)
        self.redirect("/login")
