"""The login and logout pages."""

from __future__ import annotations

import asyncio
import logging

from celeryapp.interfaces.web.base import BaseHandler
from celeryapp.interfaces.web.sessions import end_session, start_session

logger = logging.getLogger(__name__)
#: Seconds a wrong password waits before the answer.
FAILED_LOGIN_DELAY_S = 1.0


class LoginHandler(BaseHandler):
    def get(self) -> None:
        self.render("login.html", error=None, next=self._next(), user=None)

    async def post(self) -> None:
        name = self.get_body_argument("username", "")
        password = self.get_body_argument("password", "")
        user = self.ctx.users.get(name)
        # A hash check takes a good fraction of a second of CPU: off the event loop.
        valid = user is not None and await asyncio.get_running_loop().run_in_executor(None, user.check, password)
        if user is None or not valid:
            await asyncio.sleep(FAILED_LOGIN_DELAY_S)  # slows down guessing
            self.set_status(401)
            self.render("login.html", error="Wrong user name or password.", next=self._next(), user=None)
            return
        logger.info("web: %s logged in", user.name)
        start_session(self, user)
        self.redirect(self._next())

    def _next(self) -> str:
        target = self.get_argument("next", "/")
        # Only a path of this site: never //evil.example or a scheme.
        return target if target.startswith("/") and not target.startswith("//") and "\\" not in target else "/"


class LogoutHandler(BaseHandler):
    def post(self) -> None:
        end_session(self)
        self.redirect("/login")
