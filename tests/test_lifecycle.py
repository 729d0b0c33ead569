"""The execution lifecycle end to end: real worker, real Redis, SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celeryapp import app as chordbeat_app
from celeryapp import outcome
from celeryapp.application import ChordbeatCelery
from celeryapp.context import current_step
from tests.support.helpers import call, finished, run_once, step, ts

pytestmark = pytest.mark.both_databases


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


def test_failed_step_without_continue_on_failure_fails_the_run_and_drops_later_groups(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    execution = run_once(
        client,
        {
            "name": "fails",
            "every": 3600,
            "steps": [step("first"), [step("ok"), step("broken", "chordbeat.examples.fail")], step("never")],
        },
    )
    assert execution["status"] == "failed"
    assert execution["error"] == "step 'broken' failed: StepFailed: broken says so"
    assert execution["tasks"] == []
    assert {a["step"]: a["status"] for a in execution["activities"]} == {
        "first": "complete",
        "ok": "complete",
        "broken": "failed_with_error",
    }
    schedule = call(client, "chordbeat.get_schedule", name="fails")
    assert schedule["error_count"] == 1 and schedule["last_error"] == execution["error"]
    assert schedule["run_count"] == 0


def test_failed_step_with_continue_on_failure_lets_the_run_go_on(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    execution = run_once(
        client,
        {
            "name": "tolerant",
            "every": 3600,
            "steps": [[step("ok"), step("broken", "chordbeat.examples.fail", continue_on_failure=True)], step("after")],
        },
    )
    assert execution["status"] == "completed", execution["error"]
    statuses = {a["step"]: a["status"] for a in execution["activities"]}
    assert statuses == {"ok": "complete", "broken": "failed_with_error", "after": "complete"}


def test_warning_completes_the_step_and_keeps_the_message(app: ChordbeatCelery, worker: Any, client: Celery) -> None:
    execution = run_once(
        client,
        {
            "name": "warns",
            "every": 60,
            "steps": [step("careful", "chordbeat.examples.warn"), step("next")],
        },
    )
    assert execution["status"] == "completed"
    careful = execution["activities"][0]
    assert careful["status"] == "complete_with_warning"
    assert careful["message"] == "careful says so" and careful["error"] is None


def test_unregistered_task_at_run_time_fails_the_step_not_the_worker(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    call(client, "chordbeat.apply_schedule", definition={"name": "gone", "every": 60, "steps": [step("s")]})
    # Simulate a deploy that removed the task after the schedule was stored.
    from sqlalchemy import update

    from models import ScheduleStep, transaction

    with transaction(app.settings.database_url) as session:
        session.execute(update(ScheduleStep).values(task="no.such.task"))
    started = call(client, "chordbeat.trigger_schedule", name="gone")
    execution = finished(client, started["execution_id"])
    assert execution["status"] == "failed"
    assert "not registered" in execution["error"]


@chordbeat_app.task(name="tests.report_context")
def report_context() -> dict[str, Any]:
    context = current_step()
    assert context is not None
    return outcome.completed(f"{context.schedule}/{context.step}#{context.attempt} payload={context.payload}")


def test_a_step_sees_its_run_and_the_merged_payload(app: ChordbeatCelery, worker: Any, client: Celery) -> None:
    call(
        client,
        "chordbeat.apply_schedule",
        definition={
            "name": "ctx",
            "every": 60,
            "payload": {"initiator": "hr", "mode": "full"},
            "steps": [{"name": "look", "task": "tests.report_context"}],
        },
    )
    started = call(client, "chordbeat.trigger_schedule", name="ctx", payload={"mode": "delta"})
    done = finished(client, started["execution_id"])
    assert done["activities"][0]["message"] == "ctx/look#1 payload={'initiator': 'hr', 'mode': 'delta'}"


@chordbeat_app.task(name="tests.hostile_output")
def hostile_output(fail: bool) -> dict[str, Any]:
    text = "a\x00b\ud800c" + "x" * 10_000
    if fail:
        raise RuntimeError(text)
    return outcome.warning(text)


def test_a_step_writing_nul_surrogates_or_megabytes_is_recorded_all_the_same(
    app: ChordbeatCelery, worker: Any, client: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    """PostgreSQL refuses NUL in text and no driver encodes a lone surrogate: the outcome is kept,
    cut to size, with those characters made visible; so are the worker's log lines about it."""
    steps = [
        {"name": "warns", "task": "tests.hostile_output", "kwargs": {"fail": False}},
        {"name": "fails", "task": "tests.hostile_output", "kwargs": {"fail": True}},
    ]
    call(client, "chordbeat.apply_schedule", definition={"name": "hostile-out", "every": 60, "steps": steps})
    done = finished(client, call(client, "chordbeat.trigger_schedule", name="hostile-out")["execution_id"])
    warns, fails = done["activities"]
    assert warns["status"] == "complete_with_warning" and warns["message"].startswith("a\\x00b\\ud800c")
    assert fails["status"] == "failed_with_error" and fails["error"].startswith("RuntimeError: a\\x00b\\ud800c")
    assert len(warns["message"]) <= 2000 and len(fails["error"]) <= 2000
    lines = [record.getMessage() for record in caplog.records]
    assert any("step 'fails' of execution" in line for line in lines), lines
    for line in lines:
        line.encode("utf-8")  # a lone surrogate raises: a log file's encoder would fail on it
