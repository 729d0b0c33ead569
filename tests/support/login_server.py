"""A real ``chordbeat web`` process for the login tests, and HTTP clients that connect from a
chosen loopback address (127.0.0.0/8 is all this machine's), so that throttling by address and
the trusted proxy are tested with real peers."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import requests
from requests.adapters import HTTPAdapter

from celeryapp.config import Settings
from tests.support.processes import Process, settings_env
from tests.support.servers import free_port, wait_for

CHORDBEAT = str(Path(sys.executable).with_name("chordbeat"))
SECRET = "login-test-secret-" + "y" * 40


class FromAddress(HTTPAdapter):
    """Connections of this adapter leave from ``source`` (a loopback address)."""

    def __init__(self, source: str) -> None:
        self.source = source
        super().__init__()

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs["source_address"] = (self.source, 0)
        super().init_poolmanager(*args, **kwargs)


class LoginServer:
    def __init__(self, url: str, pid: int = 0) -> None:
        self.url = url
        #: The ``chordbeat web`` process's.
        self.pid = pid

    def client(self, source: str = "127.0.0.1") -> requests.Session:
        """A browser-like client connecting from ``source``, with the login page's xsrf cookie."""
        session = requests.Session()
        session.mount("http://", FromAddress(source))
        session.get(f"{self.url}/login", timeout=10)
        return session

    def log_in(self, session: requests.Session, name: str, password: str, **headers: str) -> requests.Response:
        return session.post(
            f"{self.url}/login",
            data={"username": name, "password": password, "_xsrf": session.cookies.get("_xsrf", "")},
            headers=headers,
            allow_redirects=False,
            timeout=30,
        )


@contextmanager
def chordbeat_web(settings: Settings, tmp: Path, users: str, **env: str) -> Iterator[LoginServer]:
    port = free_port()
    extra = {
        "CHORDBEAT_WEB_USERS": users,
        "CHORDBEAT_WEB_SECRET": SECRET,
        "CHORDBEAT_WEB_ADDRESS": "127.0.0.1",
        "CHORDBEAT_WEB_PORT": str(port),
        **env,
    }
    process = Process([CHORDBEAT, "web"], settings_env(settings, **extra), tmp / f"web-{port}.log")
    server = LoginServer(f"http://127.0.0.1:{port}", process.pid)
    try:
        wait_for(lambda: requests.get(server.url + "/healthz", timeout=2).ok, 30, what="chordbeat web to answer")
        yield server
    finally:
        process.stop()
