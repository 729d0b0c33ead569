"""The execution lifecycle end to end: real worker, real Redis, SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from celery import Celery

from celeryapp.app import ChordbeatCelery
from tests.conftest import call, wait_for


def hr_sync(seconds: float = 0.3, **overrides: Any) -> dict[str, Any]:
    def sleep(name: str, **extra: Any) -> dict[str, Any]:
        return {"name": name, "task": "chordbeat.examples.sleep", "kwargs": {"seconds": seconds}, **extra}

    return {
        "name": "nightly-hr-sync",
        "cron": "0 2 * * *",
        "timezone": "Europe/London",
        "payload": {"initiator": "hr"},
        "steps": [
            sleep("HR System - Full Import"),
            sleep("HR System - Full Sync"),
            [sleep("AD - Export"), sleep("LDAP - Export", continue_on_failure=True)],
            [sleep("AD - Confirming Import"), sleep("LDAP - Confirming Import")],
        ],
        **overrides,
    }


def finished(client: Celery, execution_id: int, timeout: float = 30) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        execution = call(client, "chordbeat.get_execution", execution_id=execution_id)
        return execution if execution["status"] != "in_progress" else None

    result = wait_for(done, timeout, interval=0.1, what=f"execution {execution_id} to finish")
    assert isinstance(result, dict)
    return result


def ts(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def test_nightly_hr_sync_runs_groups_in_order_and_parallel_steps_overlap(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    call(client, "chordbeat.apply_schedule", definition=hr_sync())
    started = call(client, "chordbeat.trigger_schedule", name="nightly-hr-sync")
    assert started["status"] == "in_progress"

    # All six tasks are recorded up front: group 0 queued, the rest waiting.
    first = call(client, "chordbeat.get_execution", execution_id=started["execution_id"])
    statuses = {t["step"]: t["status"] for t in first["tasks"]}
    assert len(first["tasks"]) + len(first["activities"]) >= 6
    assert statuses.get("AD - Confirming Import") == "waiting_for_previous_step"

    execution = finished(client, started["execution_id"])
    assert execution["status"] == "completed", execution["error"]
    assert execution["current_step_index"] == 3
    assert execution["tasks"] == []
    activities = execution["activities"]
    assert [a["status"] for a in activities] == ["complete"] * 6
    by_group: dict[int, list[dict[str, Any]]] = {}
    for activity in activities:
        by_group.setdefault(activity["step_index"], []).append(activity)
    for index in range(3):
        last_end = max(ts(a["completed_at"]) for a in by_group[index])
        next_start = min(ts(a["started_at"]) for a in by_group[index + 1])
        assert last_end <= next_start, f"group {index + 1} started before group {index} ended"
    ad, ldap = sorted(by_group[2], key=lambda a: a["step"])
    assert ts(ad["started_at"]) < ts(ldap["completed_at"]) and ts(ldap["started_at"]) < ts(ad["completed_at"])
    assert execution["trigger"] == "manual" and execution["payload"] == {"initiator": "hr"}
    schedule = call(client, "chordbeat.get_schedule", name="nightly-hr-sync")
    assert schedule["run_count"] == 1 and schedule["last_run_at"] is not None
