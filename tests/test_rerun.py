"""Re-running a failed execution: a new manual run of the same plan, payload and slot that starts
at the group that failed, audited; runs that did not fail or get cancelled are refused."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celeryapp import app as chordbeat_app
from celeryapp import outcome
from celeryapp.application import ChordbeatCelery
from celeryapp.messaging.redis_client import get_redis
from tests.support.helpers import call, finished, step

pytestmark = pytest.mark.both_databases


@chordbeat_app.task(name="tests.rerun_fails_first")
def fails_first(counter: str) -> dict[str, Any]:
    """Fails the first time it runs for ``counter``, then completes (a fixed upstream, say)."""
    if get_redis(chordbeat_app.settings.broker_url).incr(f"tests:{counter}") == 1:
        raise RuntimeError("the bank's server was down")
    return outcome.completed("ok")


DEFINITION = {
    "name": "export",
    "every": 3600,
    "payload": {"batch": 7},
    "steps": [
        step("prepare"),
        {"name": "upload", "task": "tests.rerun_fails_first", "kwargs": {"counter": "export"}},
        [step("notify"), step("archive")],
    ],
}


def slot_of(client: Celery, execution_id: int) -> str | None:
    rows = call(client, "chordbeat.list_slots", name="export", limit=1000)
    found: list[str | None] = [r["nominal_at"] for r in rows if r["execution_id"] == execution_id]
    assert len(found) == 1, rows
    return found[0]


def test_a_failed_run_is_run_again_from_its_failed_group_with_its_payload_and_slot(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    call(client, "chordbeat.apply_schedule", definition=DEFINITION)
    fired = app.send_task("chordbeat.fire_schedule", kwargs={"name": "export"}).get(timeout=20)
    source = finished(client, fired["execution_id"])
    assert source["status"] == "failed" and source["current_step_index"] == 1
    # The schedule changes since: the re-run keeps the plan the failed run had.
    call(client, "chordbeat.apply_schedule", definition={**DEFINITION, "steps": [step("other")]})

    rerun = call(client, "chordbeat.rerun_execution", execution_id=source["id"], actor="ops", reason="bank is back")
    assert (rerun["trigger"], rerun["rerun_of"], rerun["rerun_from_group"]) == ("manual", source["id"], 1)
    done = finished(client, rerun["id"])
    assert done["status"] == "completed"
    assert done["payload"] == source["payload"] == {"batch": 7}
    assert sorted(a["step"] for a in done["activities"]) == ["archive", "notify", "upload"]
    assert slot_of(client, rerun["id"]) == slot_of(client, source["id"]) is not None
    summary = call(client, "chordbeat.list_executions", schedule="export", limit=1)[0]
    assert (summary["rerun_of"], summary["rerun_from_group"]) == (source["id"], 1)
    assert summary["steps"] == {"total": 3, "complete": 3}
    row = call(client, "chordbeat.list_audit", schedule="export", limit=1)[0]
    assert (row["action"], row["actor"], row["reason"], row["execution_id"]) == (
        "rerun",
        "ops",
        "bank is back",
        rerun["id"],
    )
    assert row["detail"] == {"rerun_of": source["id"], "from_group": 1, "version": 1}

    # Not from the failed group: the whole plan again.
    whole = call(client, "chordbeat.rerun_execution", execution_id=source["id"], from_failed=False)
    assert whole["rerun_from_group"] == 0
    assert sorted(a["step"] for a in finished(client, whole["id"])["activities"]) == [
        "archive",
        "notify",
        "prepare",
        "upload",
    ]


def test_a_run_that_completed_or_is_running_is_not_run_again(app: ChordbeatCelery, worker: Any, client: Celery) -> None:
    call(
        client,
        "chordbeat.apply_schedule",
        definition={"name": "fine", "every": 3600, "steps": [step("s", kwargs={"seconds": 3})]},
    )
    run = call(client, "chordbeat.trigger_schedule", name="fine")["execution_id"]
    with pytest.raises(Exception, match=f"^execution {run} is in_progress; only a failed or cancelled") as raised:
        call(client, "chordbeat.rerun_execution", execution_id=run)
    assert type(raised.value).__name__ == "InvalidTransition"
    assert finished(client, run)["status"] == "completed"
    with pytest.raises(Exception, match=f"^execution {run} is completed; only a failed or cancelled"):
        call(client, "chordbeat.rerun_execution", execution_id=run)
    with pytest.raises(Exception, match=r"^execution 999 does not exist"):
        call(client, "chordbeat.rerun_execution", execution_id=999)
    with pytest.raises(Exception, match=r"^from_failed: must be true or false, got string"):
        call(client, "chordbeat.rerun_execution", execution_id=run, from_failed="yes")
    assert len(call(client, "chordbeat.list_executions")) == 1
    assert [r["action"] for r in call(client, "chordbeat.list_audit")] == ["trigger", "apply"]


def test_a_rerun_follows_the_overlap_policy(app: ChordbeatCelery, worker: Any, client: Celery) -> None:
    upload = {"name": "upload", "task": "tests.rerun_fails_first", "kwargs": {"counter": "busy"}}
    definition = {
        "name": "busy",
        "every": 3600,
        "overlap": "skip",
        "steps": [step("wait", kwargs={"seconds": 2}), upload],
    }
    call(client, "chordbeat.apply_schedule", definition=definition)
    failed = call(client, "chordbeat.trigger_schedule", name="busy")["execution_id"]
    assert finished(client, failed)["status"] == "failed"
    blocking = call(client, "chordbeat.trigger_schedule", name="busy")["execution_id"]
    answer = call(client, "chordbeat.rerun_execution", execution_id=failed, actor="ops")
    assert answer["execution_id"] is None and answer["skipped"].startswith("overlap")
    row = call(client, "chordbeat.list_audit", schedule="busy", limit=1)[0]
    assert (row["action"], row["execution_id"], row["detail"]["skipped"]) == ("rerun", None, answer["skipped"])
    assert finished(client, blocking)["status"] == "completed"
    assert len(call(client, "chordbeat.list_executions", schedule="busy")) == 2
