"""The dashboard served from a thread of the test process, on a free loopback port."""

from __future__ import annotations

import asyncio
import re
import threading
from typing import Any

import requests
import tornado.httpserver
import tornado.ioloop

from celeryapp.application import ChordbeatCelery
from celeryapp.interfaces.web.auth import hash_password, parse_users
from celeryapp.interfaces.web.server import make_app
from tests.support.servers import free_port

SECRET = "test-secret-" + "x" * 40
ADMIN = ("ops", "ops-password")
VIEWER = ("watcher", "watcher-password")
#: The admin's password hashed (few iterations: fast), the viewer's plain: both forms are tested.
USERS = f"{ADMIN[0]}:admin:{hash_password(ADMIN[1], iterations=1000)},{VIEWER[0]}:viewer:{VIEWER[1]}"


class WebServer:
    def __init__(self, app: ChordbeatCelery, users: str = USERS) -> None:
        self.app = app
        self.users = users
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop: tornado.ioloop.IOLoop | None = None
        self._server: tornado.httpserver.HTTPServer | None = None
        self._thread = threading.Thread(target=self._run, name="web", daemon=True)
        self._ready = threading.Event()

    def _run(self) -> None:
        asyncio.set_event_loop(asyncio.new_event_loop())
        self._loop = tornado.ioloop.IOLoop.current()
        self._server = make_app(self.app, parse_users(self.users), SECRET).listen(self.port, address="127.0.0.1")
        self._ready.set()
        self._loop.start()

    def __enter__(self) -> WebServer:
        self._thread.start()
        assert self._ready.wait(10), "web server did not start"
        return self

    def __exit__(self, *exc: Any) -> None:
        loop, server = self._loop, self._server
        assert loop is not None and server is not None

        def stop() -> None:
            server.stop()
            loop.stop()

        loop.add_callback(stop)
        self._thread.join(10)

    def session(self, user: tuple[str, str] | None = None) -> requests.Session:
        """A client with the xsrf cookie, logged in as ``user`` when given."""
        session = requests.Session()
        session.get(f"{self.url}/login", timeout=10)
        if user is not None:
            r = session.post(
                f"{self.url}/login",
                data={"username": user[0], "password": user[1], "_xsrf": xsrf(session)},
                allow_redirects=False,
                timeout=10,
            )
            assert r.status_code == 302, r.text
        return session


def xsrf(session: requests.Session) -> str:
    token = session.cookies.get("_xsrf")
    assert token
    return str(token)


def text_of(html: str) -> str:
    """The page's text without tags (for asserting what a reader sees)."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))
