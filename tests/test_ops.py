"""Operations: Flower behind auth, the metrics endpoint, deploy files that match the real commands."""

from __future__ import annotations

import base64
import re
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celeryapp.app import ChordbeatCelery
from celeryapp.config import Settings
from tests import processes
from tests.conftest import call, wait_for
from tests.servers import free_port
from tests.test_lifecycle import finished, step

ROOT = Path(__file__).resolve().parent.parent


def get(url: str, auth: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


@pytest.mark.slow
def test_flower_refuses_anonymous_access_and_admits_its_users(settings: Settings, tmp_path: Path) -> None:
    port = free_port()
    argv = [
        processes.CELERY,
        "-A",
        "celeryapp",
        "flower",
        "--conf=flower.cfg",
        f"--port={port}",
        f"--db={tmp_path / 'flower.db'}",
    ]
    env = processes.settings_env(settings, FLOWER_BASIC_AUTH="ops:s3cret", FLOWER_COOKIE_SECRET="test-secret")
    flower = processes.Process(argv, env, tmp_path / "flower.log")
    try:
        wait_for(lambda: get(f"http://127.0.0.1:{port}/healthcheck")[0] == 200, 30, interval=0.2, what="Flower")
        assert get(f"http://127.0.0.1:{port}/")[0] == 401
        assert get(f"http://127.0.0.1:{port}/", auth="ops:wrong")[0] == 401
        assert get(f"http://127.0.0.1:{port}/", auth="ops:s3cret")[0] == 200
        assert get(f"http://127.0.0.1:{port}/api/workers")[0] == 401
    finally:
        flower.stop()
    # Without credentials the configuration refuses to start at all.
    no_auth = {k: v for k, v in env.items() if k != "FLOWER_BASIC_AUTH"}
    refused = subprocess.run(argv, env=no_auth, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert refused.returncode != 0 and "refusing to start without authentication" in refused.stderr


def test_metrics_endpoint_reports_executions(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    call(client, "chordbeat.apply_schedule", definition={"name": "m", "every": 60, "steps": [step("a"), step("b")]})
    finished(client, call(client, "chordbeat.trigger_schedule", name="m")["execution_id"])
    first = call(client, "chordbeat.trigger_schedule", name="m")["execution_id"]
    call(client, "chordbeat.cancel_execution", execution_id=first)
    port = free_port()
    metrics = processes.Process(
        [str(Path(processes.CELERY).with_name("chordbeat")), "metrics", "--port", str(port)],
        processes.settings_env(settings),
        tmp_path / "metrics.log",
    )
    try:
        status, text = wait_for(lambda: get(f"http://127.0.0.1:{port}/metrics"), 30, interval=0.2, what="metrics")
    finally:
        metrics.stop()
    assert status == 200
    assert 'chordbeat_executions_total{schedule="m",status="completed"} 1.0' in text
    assert 'chordbeat_executions_total{schedule="m",status="cancelled"} 1.0' in text
    assert 'chordbeat_schedules{status="active"} 1.0' in text
    assert 'chordbeat_advance_latency_seconds_count{schedule="m"} 1.0' in text
    assert re.search(r'chordbeat_step_duration_seconds_count\{schedule="m"\} [23]\.0', text)
    assert "chordbeat_recovery_requeues_total 0.0" in text
