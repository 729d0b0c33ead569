"""Flower run the way the deploy files run it (flower.cfg, basic auth, its own database), for the
tests that look at what it shows."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import requests

from celeryapp.config import Settings
from tests.support import processes
from tests.support.servers import free_port, wait_for


class Flower:
    def __init__(self, settings: Settings, tmp: Path, **extra: str) -> None:
        self.port = free_port()
        self.auth = ("ops", secrets.token_urlsafe(16))
        env = processes.settings_env(
            settings,
            FLOWER_BASIC_AUTH=":".join(self.auth),
            FLOWER_COOKIE_SECRET=secrets.token_urlsafe(32),
            FLOWER_DB=str(tmp / "flower.db"),
            FLOWER_PORT=str(self.port),
            **extra,
        )
        argv = [processes.CELERY, "-A", "celeryapp", "flower", f"--conf={processes.ROOT}/flower.cfg"]
        self.process = processes.Process(argv, env, tmp / "flower.log")
        self.url = f"http://127.0.0.1:{self.port}"

    def get(self, path: str, **params: Any) -> requests.Response:
        return requests.get(self.url + path, params=params, auth=self.auth, timeout=10)

    def tasks(self, **params: Any) -> dict[str, dict[str, Any]]:
        response = self.get("/api/tasks", **params)
        response.raise_for_status()
        tasks: dict[str, dict[str, Any]] = response.json()
        return tasks


@contextlib.contextmanager
def flower(settings: Settings, tmp: Path, **extra: str) -> Iterator[Flower]:
    monitor = Flower(settings, tmp, **extra)
    with processes.running(monitor.process):

        def up() -> bool:
            with contextlib.suppress(requests.RequestException):
                return requests.get(monitor.url + "/healthcheck", timeout=2).ok
            return False

        wait_for(up, 60, interval=0.3, what=f"Flower to answer\n{monitor.process.output()}")
        yield monitor
