"""The service tasks of the contract, called by name from a plain Celery client."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celeryapp.application import ChordbeatCelery
from tests.support.helpers import call, finished, step

SCHEDULE_KEYS = {
    "name",
    "cron",
    "timezone",
    "enabled",
    "overlap",
    "max_retries",
    "retry_delay",
    "total_repeats",
    "timeout",
    "payload",
    "deadlines",
    "alerts",
    "calendar",
    "catchup",
    "dst",
    "steps",
    "status",
    "run_count",
    "error_count",
    "current_retry",
    "last_error",
    "last_run_at",
    "next_run_at",
    "paused_by",
    "paused_reason",
    "paused_at",
    "silenced",
    "open_alerts",
    "version",
}


def test_schedule_crud_pause_and_resume(app: ChordbeatCelery, worker: Any, client: Celery) -> None:
    created = call(
        client, "chordbeat.apply_schedule", definition={"name": "b-daily", "cron": "0 6 * * *", "steps": [step("s")]}
    )
    assert set(created) == SCHEDULE_KEYS
    assert created["status"] == "active" and created["next_run_at"].endswith("06:00:00.000Z")
    call(client, "chordbeat.apply_schedule", definition={"name": "a-often", "every": 30, "steps": [step("s")]})
    assert [s["name"] for s in call(client, "chordbeat.list_schedules")] == ["a-often", "b-daily"]
    assert set(call(client, "chordbeat.list_schedules")[1]) == SCHEDULE_KEYS  # b-daily, a cron one
    # Only get_schedule counts the runs (a count over its executions).
    assert set(call(client, "chordbeat.get_schedule", name="b-daily")) == SCHEDULE_KEYS | {"runs"}

    paused = call(client, "chordbeat.pause_schedule", name="b-daily")
    assert paused["status"] == "paused" and paused["next_run_at"] is None
    assert call(client, "chordbeat.pause_schedule", name="b-daily")["status"] == "paused"  # idempotent
    resumed = call(client, "chordbeat.resume_schedule", name="b-daily")
    assert resumed["status"] == "active" and resumed["next_run_at"] is not None

    # Re-applying the same definition changes nothing, including a pause.
    call(client, "chordbeat.pause_schedule", name="a-often")
    again = call(client, "chordbeat.apply_schedule", definition={"name": "a-often", "every": 30, "steps": [step("s")]})
    assert again["status"] == "paused"

    assert call(client, "chordbeat.delete_schedule", name="a-often") == {"name": "a-often", "deleted": True}
    with pytest.raises(Exception, match="does not exist"):
        call(client, "chordbeat.delete_schedule", name="a-often")


def test_executions_are_listed_newest_first_and_filtered(app: ChordbeatCelery, worker: Any, client: Celery) -> None:
    call(client, "chordbeat.apply_schedule", definition={"name": "ok", "every": 60, "steps": [step("s")]})
    call(
        client,
        "chordbeat.apply_schedule",
        definition={"name": "bad", "every": 60, "steps": [step("s", "chordbeat.examples.fail")]},
    )
    ids: list[int] = []
    for name in ("ok", "bad", "ok"):
        started = call(client, "chordbeat.trigger_schedule", name=name, payload={"run": len(ids)})
        ids.append(started["execution_id"])
        finished(client, ids[-1])
    listed = call(client, "chordbeat.list_executions")
    assert [e["id"] for e in listed] == ids[::-1]
    assert [e["id"] for e in call(client, "chordbeat.list_executions", schedule="ok")] == [ids[2], ids[0]]
    assert [e["id"] for e in call(client, "chordbeat.list_executions", status="failed")] == [ids[1]]
    assert [e["id"] for e in call(client, "chordbeat.list_executions", limit=1)] == [ids[2]]
    # Summaries: no payload, activities or tasks (get_execution has them), the steps counted.
    assert "payload" not in listed[0] and "activities" not in listed[0] and "tasks" not in listed[0]
    assert [e["steps"] for e in listed] == [
        {"total": 1, "complete": 1},
        {"total": 1, "failed_with_error": 1},
        {"total": 1, "complete": 1},
    ]
    assert call(client, "chordbeat.get_execution", execution_id=ids[2])["payload"] == {"run": 2}
    with pytest.raises(Exception, match="limit: must be an integer between 1 and 500, got 501"):
        call(client, "chordbeat.list_executions", limit=501)


def test_deleting_a_schedule_keeps_its_history(app: ChordbeatCelery, worker: Any, client: Celery) -> None:
    call(client, "chordbeat.apply_schedule", definition={"name": "gone", "every": 60, "steps": [step("s")]})
    execution_id = call(client, "chordbeat.trigger_schedule", name="gone")["execution_id"]
    finished(client, execution_id)
    call(client, "chordbeat.delete_schedule", name="gone")
    kept = call(client, "chordbeat.get_execution", execution_id=execution_id)
    assert kept["schedule"] == "gone" and kept["status"] == "completed"


def test_the_client_hides_payloads_and_env_from_task_reprs() -> None:
    from celeryapp.domain.redaction import redact

    definition = {"name": "x", "payload": {"token": "s3cret"}, "steps": [{"name": "e", "env": {"PASSWORD": "p"}}]}
    shown = repr(redact({"definition": definition}))
    assert "s3cret" not in shown and "PASSWORD" not in shown and "'name': 'x'" in shown
    assert redact({"payload": None}) == {"payload": None}
