"""Operations: Flower behind auth, the metrics endpoint, deploy files that match the real commands."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.monitoring.health import age_s, problem, touch
from tests.support import processes
from tests.support.helpers import call, finished, http_get, step, wait_for
from tests.support.servers import RedisServer, free_port

ROOT = Path(__file__).resolve().parent.parent


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
    env = processes.settings_env(
        settings, FLOWER_BASIC_AUTH="ops:s3cret-Pw-91kQ", FLOWER_COOKIE_SECRET="Zt4q-8LmN0vR2xW6yB1cD9eF3gH5jK7a"
    )
    flower = processes.Process(argv, env, tmp_path / "flower.log")
    try:
        wait_for(lambda: http_get(f"http://127.0.0.1:{port}/healthcheck")[0] == 200, 30, interval=0.2, what="Flower")
        assert http_get(f"http://127.0.0.1:{port}/")[0] == 401
        assert http_get(f"http://127.0.0.1:{port}/", auth="ops:wrong")[0] == 401
        assert http_get(f"http://127.0.0.1:{port}/", auth="ops:s3cret-Pw-91kQ")[0] == 200
        assert http_get(f"http://127.0.0.1:{port}/api/workers")[0] == 401
    finally:
        flower.stop()
    # Without credentials the configuration refuses to start at all.
    no_auth = {k: v for k, v in env.items() if k != "FLOWER_BASIC_AUTH"}
    refused = subprocess.run(argv, env=no_auth, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert refused.returncode != 0 and "refusing to start without authentication" in refused.stderr
    # Nor with the password `make run` used to ship.
    placeholder = {**env, "FLOWER_BASIC_AUTH": "chordbeat:chordbeat-local"}
    refused = subprocess.run(argv, env=placeholder, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert refused.returncode != 0 and "is a placeholder" in refused.stderr


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
        status, text = wait_for(lambda: http_get(f"http://127.0.0.1:{port}/metrics"), 30, interval=0.2, what="metrics")
    finally:
        metrics.stop()
    assert status == 200
    assert 'chordbeat_executions_total{schedule="m",status="completed"} 1.0' in text
    assert 'chordbeat_executions_total{schedule="m",status="cancelled"} 1.0' in text
    assert 'chordbeat_schedules{status="active"} 1.0' in text
    assert 'chordbeat_advance_latency_seconds_count{schedule="m"} 1.0' in text
    assert re.search(r'chordbeat_step_duration_seconds_count\{schedule="m"\} [23]\.0', text)
    assert "chordbeat_recovery_requeues_total 0.0" in text


def test_liveness_files_in_a_shared_directory_go_to_a_private_subdirectory(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp
    settings = Settings(health_dir=str(shared))
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    # Another user plants a symlink where the file's temporary copy would go, and a fresh file
    # that would answer for a worker that never ran.
    (shared / "chordbeat-worker.health.tmp").symlink_to(victim)
    (shared / "chordbeat-worker.health").write_text("9999999999\n")
    assert age_s(settings, "worker") is None
    touch(settings, "worker")
    assert victim.read_text() == "precious\n"
    private = shared / f"chordbeat-{os.geteuid()}"
    assert private.is_dir() and not private.is_symlink() and private.stat().st_mode & 0o777 == 0o700
    assert (private / "chordbeat-worker.health").is_file()
    age = age_s(settings, "worker")
    assert age is not None and age < 5


@pytest.mark.parametrize("plant", ["symlink", "open-mode"])
def test_a_private_liveness_directory_that_is_not_private_is_refused(tmp_path: Path, plant: str) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    private = shared / f"chordbeat-{os.geteuid()}"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    if plant == "symlink":
        private.symlink_to(elsewhere)
    else:
        private.mkdir()
        private.chmod(0o777)
    settings = Settings(health_dir=str(shared))
    touch(settings, "worker")
    assert not list(elsewhere.iterdir()) and not (private / "chordbeat-worker.health").exists()
    assert age_s(settings, "worker") is None
    reason = problem(settings)
    assert reason is not None and private.name in reason


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand a directory to another user")
def test_a_liveness_directory_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 65534, 65534)
    reason = problem(Settings(health_dir=str(theirs)))
    assert reason is not None and "owned by uid 65534" in reason


@pytest.mark.slow
def test_make_run_restarts_a_killed_worker_and_ctrl_c_stops_everything(
    redis_server: RedisServer, sqlite_template: Path, tmp_path: Path
) -> None:
    redis.Redis.from_url(redis_server.url).flushall()
    shutil.copy(sqlite_template, tmp_path / "chordbeat.db")
    settings = Settings(
        broker_url=redis_server.url,
        result_backend=redis_server.url,
        redbeat_url=redis_server.url,
        database_url=f"sqlite:///{tmp_path / 'chordbeat.db'}",
        health_dir=str(tmp_path),
    )
    run_dir = tmp_path / "run"
    marker = f"CHORDBEAT_RUN_DIR={run_dir}"
    env = processes.settings_env(
        settings,
        CHORDBEAT_RUN_DIR=str(run_dir),
        FLOWER_PORT=str(free_port()),
        PATH=f"{Path(processes.CELERY).parent}:{os.environ['PATH']}",
    )
    log = tmp_path / "make-run.log"
    inspector = Celery("inspector", broker=settings.broker_url, set_as_current=False)

    def worker_pids() -> dict[str, int]:
        stats = inspector.control.inspect(timeout=1).stats() or {}
        return {node.split("@")[0]: info["pid"] for node, info in stats.items()}

    with log.open("wb") as out:
        run = subprocess.Popen(
            ["bash", str(ROOT / "deploy" / "local" / "run.sh")], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        first = wait_for(lambda: (p := worker_pids()).keys() >= {"steps1", "control1"} and p, 120, interval=0.5)
        assert isinstance(first, dict)
        os.kill(first["steps1"], signal.SIGKILL)
        again = wait_for(
            lambda: (p := worker_pids()).get("steps1", first["steps1"]) != first["steps1"] and p,
            60,
            interval=0.5,
            what="a new step worker to answer",
        )
        assert isinstance(again, dict)
        assert again["control1"] == first["control1"] and run.poll() is None, log.read_text()
        assert "respawn: celery exited with status -9" in log.read_text()
        # Ctrl-C: the terminal sends SIGINT to honcho, which stops every process.
        run.send_signal(signal.SIGINT)
        run.wait(60)
        wait_for(lambda: not processes.started_by(marker), 30, interval=0.2, what="every make run process to stop")
    finally:
        inspector.close()
        if run.poll() is None:
            run.kill()
            run.wait(10)
        for pid in processes.started_by(marker):
            os.kill(pid, signal.SIGKILL)
    local_env = run_dir / "local.env"
    assert local_env.stat().st_mode & 0o777 == 0o600
    password = dict(line.split("=", 1) for line in local_env.read_text().split())["LOCAL_FLOWER_PASSWORD"]
    assert len(password) >= 20 and f"(user chordbeat, password {password})" in log.read_text()
    # flower.cfg accepted the generated credentials.
    assert "Visit me at http://127.0.0.1:" in log.read_text()
    # The CLI in another terminal gets the same settings from a file only the user can read.
    cli_env = run_dir / "cli.env"
    assert cli_env.stat().st_mode & 0o777 == 0o600
    assert f"export CHORDBEAT_BROKER_URL={settings.broker_url}" in cli_env.read_text()
    # The banner, once everything answered, says how.
    banner = [line.split("| ", 1)[-1].strip() for line in log.read_text().splitlines() if " ready.1 " in line]
    assert "chordbeat is up" in banner, banner
    said = banner.index(f". {run_dir}/cli.env")
    assert banner[said + 1] == "chordbeat run nightly-hr-sync --wait", banner
