"""The ``chordbeat`` command against a real worker, through the service tasks."""

from __future__ import annotations

import json
import os
from typing import Any

from click.testing import CliRunner, Result

from celeryapp.app import ChordbeatCelery
from celeryapp.cli import main
from celeryapp.config import Settings
from celeryapp.health import touch
from tests.conftest import call
from tests.test_lifecycle import step


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_run_wait_exits_zero_only_for_a_completed_run(app: ChordbeatCelery, worker: Any, client: Any) -> None:
    call(client, "chordbeat.apply_schedule", definition={"name": "good", "every": 60, "steps": [step("a"), step("b")]})
    call(
        client,
        "chordbeat.apply_schedule",
        definition={"name": "bad", "every": 60, "steps": [step("a", "chordbeat.examples.fail")]},
    )
    ok = cli("run", "good", "--wait", "--payload", '{"who": "cli"}')
    assert ok.exit_code == 0, ok.output
    assert "execution 1: completed" in ok.output
    failed = cli("run", "bad", "--wait")
    assert failed.exit_code == 1
    assert "step 'a' failed: StepFailed: a says so" in failed.output
    as_json = cli("run", "good", "--wait", "--json")
    assert as_json.exit_code == 0 and json.loads(as_json.output)["payload"] == {}
    assert cli("run", "good", "--payload", "{nope").exit_code == 2
    assert "does not exist" in cli("run", "missing").output


def test_read_commands_offer_json(app: ChordbeatCelery, worker: Any, client: Any) -> None:
    call(
        client,
        "chordbeat.apply_schedule",
        definition={"name": "ny", "cron": "0 2 * * *", "timezone": "Asia/Tokyo", "steps": [step("s")]},
    )
    listed = json.loads(cli("list", "--json").output)
    assert [s["name"] for s in listed] == ["ny"]
    upcoming = json.loads(cli("next", "ny", "-n", "3", "--json").output)
    assert len(upcoming) == 3 and all(t.endswith("T02:00:00+09:00") for t in upcoming), upcoming
    assert "T02:00:00+09:00  (JST)" in cli("next", "ny", "-n", "2").output
    cli("run", "ny", "--wait")
    shown = json.loads(cli("show", "ny", "--json").output)
    assert shown["schedule"]["run_count"] == 1 and len(shown["executions"]) == 1
    assert shown["slots"][0]["outcome"] == "fired" and shown["slots"][0]["trigger"] == "manual"
    assert "recent executions" in cli("show", "ny").output
    executions = json.loads(cli("executions", "--schedule", "ny", "--json").output)
    assert executions[0]["status"] == "completed"
    assert json.loads(cli("pause", "ny", "--json").output)["status"] == "paused"
    assert "ny: active" in cli("resume", "ny").output


def test_cancel_from_the_cli(app: ChordbeatCelery, worker: Any, client: Any) -> None:
    call(
        client,
        "chordbeat.apply_schedule",
        definition={"name": "slow", "every": 60, "steps": [step("s", kwargs={"seconds": 30})]},
    )
    execution_id = call(client, "chordbeat.trigger_schedule", name="slow")["execution_id"]
    assert f"execution {execution_id}: cancelled" in cli("cancel", str(execution_id)).output


def test_health_reports_stale_and_fresh_liveness_files(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("CHORDBEAT_HEALTH_DIR", str(tmp_path))
    assert cli("health", "worker").exit_code == 1
    touch(Settings(health_dir=str(tmp_path)), "worker")
    healthy = cli("health", "worker")
    assert healthy.exit_code == 0 and "worker: healthy" in healthy.output
    path = tmp_path / "chordbeat-worker.health"
    os.utime(path, (0, 0))
    assert "unhealthy" in cli("health", "worker").output


def test_the_live_view_shows_each_step_once_with_its_current_attempt() -> None:
    from celeryapp.cli import step_states

    execution = {
        "activities": [
            {"step_index": 0, "step": "a", "status": "complete", "attempt": 1},
            {"step_index": 1, "step": "b", "status": "failed_with_error", "attempt": 1},
            {"step_index": 1, "step": "c", "status": "in_progress", "attempt": 1},
        ],
        "tasks": [
            {"step_index": 1, "step": "b", "status": "queued", "attempt": 2},
            {"step_index": 1, "step": "c", "status": "processing", "attempt": 1},
            {"step_index": 2, "step": "d", "status": "waiting_for_previous_step", "attempt": 1},
        ],
    }
    assert step_states(execution) == {
        (0, "a"): ("complete", 1),
        (1, "b"): ("queued", 2),
        (1, "c"): ("in_progress", 1),
        (2, "d"): ("waiting_for_previous_step", 1),
    }
