"""Secrets never leave: Redis passwords, payloads and executables' env values stay out of what
``celery inspect conf``, Flower and the logs show, while callers still get their answers whole."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from redis.connection import parse_url

from celeryapp.client import ChordbeatClient
from celeryapp.config import Settings
from celeryapp.domain.redaction import credentials_apart
from tests.support import processes
from tests.support.helpers import http_get, wait_for
from tests.support.servers import RedisServer, free_port

REDIS_PASSWORD = "redis-pw-4f9c2e81d7"
PAYLOAD_SECRET = "payload-secret-7d1a"
TRIGGER_SECRET = "trigger-secret-55c0"
ENV_SECRET = "env-secret-93be"
SECRETS = (REDIS_PASSWORD, PAYLOAD_SECRET, TRIGGER_SECRET, ENV_SECRET)
FLOWER_AUTH = "ops:Flower-pw-8s2kq0v7x"


@pytest.fixture(scope="module")
def secret_redis() -> Iterator[RedisServer]:
    server = RedisServer(password=REDIS_PASSWORD)
    server.start()
    yield server
    server.close()


@pytest.fixture
def secret_settings(secret_redis: RedisServer, sqlite_template: Path, tmp_path: Path) -> Settings:
    # What is shown does not depend on the database: SQLite only.
    shutil.copy(sqlite_template, tmp_path / "chordbeat.db")
    return Settings(
        broker_url=secret_redis.url,
        result_backend=secret_redis.url,
        redbeat_url=secret_redis.url,
        database_url=f"sqlite:///{tmp_path / 'chordbeat.db'}",
        health_dir=str(tmp_path),
    )


def assert_hidden(text: str, where: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{secret!r} shows in {where}"


@pytest.mark.parametrize(
    ("url", "kept", "options"),
    [
        ("redis://:pw@h:6379/0", "redis://h:6379/0", {"password": "pw"}),
        (
            "rediss://ops:p%40ss@h/1?ssl_cert_reqs=required",
            "rediss://h/1?ssl_cert_reqs=required",
            {"username": "ops", "password": "p@ss"},
        ),
        ("redis://h/0?password=pw&db=2", "redis://h/0?db=2", {"password": "pw"}),
        ("unix://:pw@/run/redis.sock?db=1", "unix:///run/redis.sock?db=1", {"password": "pw"}),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0", {}),
    ],
)
def test_credentials_are_taken_out_of_redis_urls(url: str, kept: str, options: dict[str, str]) -> None:
    assert credentials_apart(url) == (kept, options)
    # What redis-py makes of the pieces is what it made of the whole URL.
    whole = parse_url(url)
    assert {**parse_url(kept), **options} == whole


@pytest.mark.slow
def test_the_redis_password_is_masked_in_inspect_conf_and_startup_logs(
    secret_settings: Settings, secret_redis: RedisServer, tmp_path: Path
) -> None:
    inspector = Celery("inspector", broker=secret_settings.broker_url, set_as_current=False)
    try:
        with (
            processes.worker(secret_settings, tmp_path, "conf") as worker,
            processes.beat(secret_settings, tmp_path) as beat,
        ):
            conf = wait_for(lambda: inspector.control.inspect(timeout=2).conf(), 60, what="the worker's conf")
            # Beat reaches Redis with the password kept apart from RedBeat's URL.
            wait_for(lambda: "acquired lock" in beat.output().lower(), 60, interval=0.2, what="beat to take the lock")
    finally:
        inspector.close()
    assert isinstance(conf, dict)
    (shown,) = conf.values()
    assert_hidden(json.dumps(conf), "celery inspect conf")
    assert shown["redbeat_redis_url"] == f"redis://127.0.0.1:{secret_redis.port}/0"
    assert shown["redbeat_redis_options"]["password"] == "********"
    assert shown["broker_url"] == f"redis://:********@127.0.0.1:{secret_redis.port}/0"
    assert_hidden(worker.output(), "the worker's log")
    assert_hidden(beat.output(), "beat's log")


def flower_tasks(port: int) -> dict[str, Any]:
    status, body = http_get(f"http://127.0.0.1:{port}/api/tasks", auth=FLOWER_AUTH)
    assert status == 200, status
    tasks: dict[str, Any] = json.loads(body)
    return tasks


@pytest.mark.slow
def test_flower_and_worker_logs_show_answers_without_payloads_or_env_values(
    secret_settings: Settings, tmp_path: Path
) -> None:
    # Executable steps are off by default; this test needs one whose env values must stay hidden.
    secret_settings = replace(
        secret_settings, step_kinds=frozenset({"task", "executable"}), executable_allow=(sys.executable,)
    )
    port = free_port()
    argv = [processes.CELERY, "-A", "celeryapp", "flower", "--conf=flower.cfg", f"--port={port}"]
    flower_env = processes.settings_env(
        secret_settings,
        FLOWER_BASIC_AUTH=FLOWER_AUTH,
        FLOWER_COOKIE_SECRET="k" * 8 + "Q1x9Zr4TbL0mV7nW2pS6yH3dJ8fG5cA",
        FLOWER_DB=str(tmp_path / "flower.db"),
    )
    definition = {
        "name": "vault",
        "every": 3600,
        "payload": {"token": PAYLOAD_SECRET},
        "steps": [
            {
                "name": "export",
                "kind": "executable",
                "argv": [sys.executable, "-c", "pass"],
                "env": {"API_KEY": ENV_SECRET},
            }
        ],
    }
    with (
        processes.worker(secret_settings, tmp_path, "shown") as worker,
        processes.Process(argv, flower_env, tmp_path / "flower.log") as flower,
        ChordbeatClient(secret_settings.broker_url, secret_settings.result_backend) as client,
    ):
        # Flower switches task events on in the workers shortly after it starts.
        # (Read-only calls send no events: a call that changes something shows Flower is listening.)
        wait_for(lambda: client.apply_schedule(definition) and flower_tasks(port), 60, interval=0.5, what="events")
        applied = client.apply_schedule(definition)
        assert applied["payload"] == {"token": PAYLOAD_SECRET}
        assert applied["steps"][0]["env"] == {"API_KEY": "<hidden>"}
        assert client.get_schedule("vault")["steps"][0]["env"] == {"API_KEY": "<hidden>"}
        assert client.list_schedules()[0]["steps"][0]["env"] == {"API_KEY": "<hidden>"}
        execution_id = client.trigger_schedule("vault", payload={"extra": TRIGGER_SECRET})["execution_id"]
        done = wait_for(lambda: (e := client.get_execution(execution_id))["status"] != "in_progress" and e, 60)
        assert isinstance(done, dict) and done["status"] == "completed", done
        # The caller gets the answer whole.
        assert done["payload"] == {"token": PAYLOAD_SECRET, "extra": TRIGGER_SECRET}

        def all_shown() -> dict[str, Any] | None:
            tasks = flower_tasks(port)
            names = {t["name"] for t in tasks.values() if t["state"] == "SUCCESS"}
            # (Read-only calls such as get_execution send no events: Flower does not list them.)
            wanted = {"chordbeat.apply_schedule", "chordbeat.trigger_schedule", "vault/export"}
            return tasks if wanted <= names else None

        tasks = wait_for(all_shown, 60, interval=0.5, what="Flower to show the calls")
        status, workers = http_get(f"http://127.0.0.1:{port}/api/workers?refresh=1", auth=FLOWER_AUTH)
        assert status == 200
    assert_hidden(json.dumps(tasks), "Flower's tasks")
    assert_hidden(workers, "Flower's workers")
    results = [
        t["result"] for t in tasks.values() if t["name"] == "chordbeat.apply_schedule" and t["state"] == "SUCCESS"
    ]
    assert any("'payload': '<hidden>'" in r for r in results), results
    assert_hidden(worker.output(), "the worker's log")
    assert "succeeded in" in worker.output()
    assert_hidden(flower.output(), "Flower's log")
