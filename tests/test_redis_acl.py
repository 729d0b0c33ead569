"""deploy/redis/users.acl, on a real Redis started with it: each role does its job and nothing else."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import secrets
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from string import Template
from typing import Any

import pytest
import redis
from celery import Celery
from kombu import Exchange, Queue

from celeryapp.config import Settings
from tests.support import processes
from tests.support.flower import flower
from tests.support.helpers import call, finished, step
from tests.support.servers import free_port, wait_for

ACL_FILE = Path(processes.ROOT) / "deploy" / "redis" / "users.acl"
ROLES = ("chordbeat", "service", "monitor")
#: A caller held to its own results as docs/security.md says: its own user, its own task id prefix.
OWN_RESULTS_CALLER = "billing"


@dataclasses.dataclass
class AclRedis:
    port: int
    passwords: dict[str, str]

    def url(self, role: str) -> str:
        user = role if role in ("chordbeat", OWN_RESULTS_CALLER) else f"chordbeat-{role}"
        return f"redis://{user}:{self.passwords[role]}@127.0.0.1:{self.port}/0"

    def client(self, role: str) -> redis.Redis:
        return redis.Redis.from_url(self.url(role))


@pytest.fixture
def acl_redis() -> Iterator[AclRedis]:
    directory = Path(tempfile.mkdtemp(prefix="chordbeat-acl-"))
    passwords = {role: secrets.token_urlsafe(16) for role in (*ROLES, OWN_RESULTS_CALLER)}
    hashes = {
        # The workers' user is `chordbeat`; its variable says APP, as no CHORDBEAT_* name may be undocumented.
        f"REDIS_ACL_{'APP' if role == 'chordbeat' else role.upper()}_SHA256": hashlib.sha256(p.encode()).hexdigest()
        for role, p in passwords.items()
    }
    rendered = Template(ACL_FILE.read_text()).substitute(hashes)
    (service_line,) = [line for line in rendered.splitlines() if line.startswith("user chordbeat-service ")]
    own_results = (
        service_line.replace("chordbeat-service", OWN_RESULTS_CALLER)
        .replace(hashes["REDIS_ACL_SERVICE_SHA256"], hashes[f"REDIS_ACL_{OWN_RESULTS_CALLER.upper()}_SHA256"])
        .replace("celery-task-meta-*", f"celery-task-meta-{OWN_RESULTS_CALLER}-*")
    )
    (directory / "users.acl").write_text(f"{rendered}{own_results}\n")
    server = AclRedis(free_port(), passwords)
    binary = shutil.which("redis-server")
    assert binary is not None
    argv = [
        binary,
        "--port",
        str(server.port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(directory),
        "--save",
        "",
        "--loglevel",
        "warning",
    ]
    proc = subprocess.Popen([*argv, "--aclfile", str(directory / "users.acl")], stdout=subprocess.PIPE, text=True)

    def answers() -> bool:
        assert proc.poll() is None, f"redis-server refused the ACL file:\n{proc.communicate()[0]}"
        return bool(server.client("chordbeat").ping())

    try:
        wait_for(answers, 10, what="redis-server with the ACL file to answer")
        yield server
    finally:
        proc.kill()
        proc.wait(10)
        shutil.rmtree(directory, ignore_errors=True)


def service_caller(url: str) -> Celery:
    """A plain Celery client as docs/security.md configures one for the service user: it publishes
    straight to the service queue (kombu's default exchange) and declares nothing."""
    client = Celery("other-service", broker=url, backend=url, set_as_current=False)
    client.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        task_queues=[Queue("celery", Exchange(""), routing_key="celery", no_declare=True)],  # type: ignore[no-untyped-call]
        task_default_exchange="",
    )
    return client


def flower_view(settings: Settings, tmp: Path) -> dict[str, Any]:
    """What Flower's workers API shows, asked afresh (``refresh``: its inspection commands)."""
    with flower(settings, tmp) as monitor:

        def listed() -> dict[str, Any] | None:
            shown: dict[str, Any] = monitor.get("/api/workers", refresh="1").json()
            return shown if any(w.get("stats") for w in shown.values()) else None

        found = wait_for(listed, 30, interval=0.5, what=f"Flower to list the worker\n{monitor.process.output()}")
        assert isinstance(found, dict)
        output = monitor.process.output()
    assert "no permissions" not in output, output
    return found


def test_composes_redis_starts_with_each_roles_acl_user_from_the_environment(
    tmp_path: Path,
) -> None:
    """deploy/redis/start.sh, as compose runs it: each role's user logs in with its own password,
    the default user is off, the rendered ACL file holds only hashes (mode 0600), and the
    healthcheck's redis-cli reads its password from ``REDISCLI_AUTH``. Compose used to run Redis
    with ``--requirepass`` and the healthcheck with ``redis-cli -a``: passwords in arguments, which
    test_deploy's command-line check refuses. (Redis rewrites its own title and environment block,
    so /proc shows nothing either way there: the arguments are checked where they are written.)"""
    passwords = {role: secrets.token_urlsafe(16) for role in ("APP", "SERVICE", "MONITOR")}
    port = free_port()
    env = {
        "PATH": os.environ["PATH"],
        "REDIS_ACL_TEMPLATE": str(ACL_FILE),
        "REDIS_ACL_RENDERED": str(tmp_path / "users.acl"),
        **{f"REDIS_{role}_PASSWORD": password for role, password in passwords.items()},
    }
    start = Path(processes.ROOT) / "deploy" / "redis" / "start.sh"
    extra = ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path), "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(["bash", str(start), *extra], env=env, stdout=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: proc.poll() is None and _answers(port, "chordbeat", passwords["APP"]), 10, what="Redis")
        for user, role in (("chordbeat-monitor", "MONITOR"), ("chordbeat-service", "SERVICE")):
            assert _answers(port, user, passwords[role]), user
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port).ping()
        with pytest.raises(redis.AuthenticationError):
            _answers(port, "chordbeat", passwords["MONITOR"])
        # The rendered file holds hashes only, readable by Redis's user alone.
        rendered = tmp_path / "users.acl"
        assert rendered.stat().st_mode & 0o077 == 0, oct(rendered.stat().st_mode)
        text = rendered.read_text()
        for password in passwords.values():
            assert password not in text and hashlib.sha256(password.encode()).hexdigest() in text
        health = subprocess.run(
            ["redis-cli", "-p", str(port), "--user", "chordbeat-monitor", "ping"],
            env={"PATH": os.environ["PATH"], "REDISCLI_AUTH": passwords["MONITOR"]},
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        assert health.stdout.strip() == "PONG", health
    finally:
        proc.kill()
        proc.wait(10)


def _answers(port: int, user: str, password: str) -> bool:
    return bool(redis.Redis(port=port, username=user, password=password).ping())


def test_the_default_user_is_off(acl_redis: AclRedis) -> None:
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=acl_redis.port).ping()


@pytest.mark.parametrize(
    "command",
    [
        ("PUBLISH", "/0.celery.pidbox", "{}"),  # remote control
        ("GET", "chordbeat:alerts:sender"),
        ("SET", "chordbeat:alerts:sender", "x"),
        ("SADD", "_kombu.binding.celery", "x"),  # kombu's routing table
        ("LPUSH", "chordbeat.control", "{}"),  # chordbeat's own queues
        ("LPUSH", "chordbeat", "{}"),
        ("BRPOP", "celery", "1"),  # take other callers' calls
        ("DEL", "celery"),
        ("SET", "celery-task-meta-x", "{}"),  # forge a result
        ("KEYS", "*"),
        ("SCAN", "0"),
        ("CONFIG", "GET", "*"),
        ("FLUSHALL",),
    ],
)
def test_a_service_caller_is_kept_off_everything_but_its_queue_and_results(
    acl_redis: AclRedis, command: tuple[str, ...]
) -> None:
    with pytest.raises(redis.exceptions.NoPermissionError):
        acl_redis.client("service").execute_command(*command)


@pytest.mark.parametrize(
    "command",
    [
        ("LPUSH", "celery", "{}"),  # queue a task (a service call)
        ("LPUSH", "chordbeat", "{}"),
        ("GET", "celery-task-meta-x"),  # read a result
        ("GET", "chordbeat:alerts:sender"),
        ("SET", "chordbeat:alerts:sender", "x"),
        ("BRPOP", "celery", "1"),
        ("KEYS", "*"),
        ("FLUSHALL",),
    ],
)
def test_a_monitor_reads_but_queues_and_reads_no_task(acl_redis: AclRedis, command: tuple[str, ...]) -> None:
    with pytest.raises(redis.exceptions.NoPermissionError):
        acl_redis.client("monitor").execute_command(*command)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_each_role_does_its_job_under_the_acl_file(acl_redis: AclRedis, settings: Settings, tmp_path: Path) -> None:
    own, watching = acl_redis.url("chordbeat"), acl_redis.url("monitor")
    chordbeat = dataclasses.replace(settings, broker_url=own, result_backend=own, redbeat_url=own)
    # Flower gets no database (the deploy files give it none): a database it cannot open.
    no_database = "sqlite:////nonexistent/flower-opens-no-database.db"
    monitor_settings = dataclasses.replace(
        settings, broker_url=watching, result_backend=watching, redbeat_url=watching, database_url=no_database
    )
    definition = {"name": "acl", "every": 3600, "steps": [step("a")]}
    caller = service_caller(acl_redis.url("service"))
    monitor = Celery("flower", broker=acl_redis.url("monitor"), set_as_current=False)
    try:
        with processes.worker(chordbeat, tmp_path) as worker, processes.beat(chordbeat, tmp_path) as beat:
            wait_for(lambda: monitor.control.ping(timeout=1), 60, what=f"the worker to answer\n{worker.output()}")
            flower_workers = flower_view(monitor_settings, tmp_path)
            stats = monitor.control.inspect(timeout=2).stats()
            queued = acl_redis.client("monitor").llen("celery")
            call(caller, "chordbeat.apply_schedule", definition=definition)
            execution_id = call(caller, "chordbeat.trigger_schedule", name="acl")["execution_id"]
            done = finished(caller, execution_id)
            billing = service_caller(acl_redis.url(OWN_RESULTS_CALLER))
            try:
                own_id = f"{OWN_RESULTS_CALLER}-{uuid.uuid4()}"
                own_answer = billing.send_task("chordbeat.list_schedules", task_id=own_id).get(timeout=20)
            finally:
                billing.close()
            others_id = caller.send_task("chordbeat.list_schedules").id
            wait_for(lambda: acl_redis.client("chordbeat").exists(f"celery-task-meta-{others_id}"), 20)
            with pytest.raises(redis.exceptions.NoPermissionError):
                acl_redis.client(OWN_RESULTS_CALLER).get(f"celery-task-meta-{others_id}")
            log = worker.output() + beat.output()
    finally:
        caller.close()
        monitor.close()
    assert done["status"] == "completed", done
    assert [s["name"] for s in own_answer] == ["acl"]
    assert stats and queued == 0
    # Flower, as the monitor user, lists the worker with what its inspection commands answered.
    (shown,) = flower_workers.values()
    assert shown["stats"]["pid"] and shown["active_queues"]
    assert "beat: acquired lock" in log
    assert "no permissions" not in log and "NoPermission" not in log
