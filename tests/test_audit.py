"""Who did what: every mutation leaves one audit row, whoever asked (another service, the CLI, the
dashboard, beat itself), and list_audit shows them as the contract says."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from celery import Celery

from celeryapp.application import ChordbeatCelery
from celeryapp.client import ChordbeatClient
from celeryapp.config import Settings
from celeryapp.contract import SOURCE_HEADER
from celeryapp.errors import InvalidArgument
from celeryapp.interfaces import service
from celeryapp.recovery import housekeeping, recovery
from models import AuditAction, AuditSource, transaction, utcnow
from models.audit import BEAT
from tests.support import processes
from tests.support.helpers import call, finished, running, step, wait_for

AUDIT_KEYS = {"id", "at", "actor", "source", "action", "schedule", "execution_id", "reason", "detail"}
SLOW = {"seconds": 30}


def apply(client: Celery, name: str, **extra: Any) -> dict[str, Any]:
    definition = {"name": name, "every": 3600, "steps": [step("s", kwargs=SLOW)], **extra}
    result: dict[str, Any] = call(client, "chordbeat.apply_schedule", definition=definition)
    return result


def trail(client: Celery, schedule: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = call(client, "chordbeat.list_audit", schedule=schedule, limit=limit)
    return rows


def test_every_service_call_leaves_a_row_newest_first_in_the_contracts_shape(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    apply(client, "nightly")
    paused = call(client, "chordbeat.pause_schedule", name="nightly", actor="alice", reason="bank holiday")
    assert paused["paused_by"] == "alice" and paused["paused_reason"] == "bank holiday"
    assert paused["paused_at"] is not None
    resumed = call(client, "chordbeat.resume_schedule", name="nightly")
    assert (resumed["paused_by"], resumed["paused_reason"], resumed["paused_at"]) == (None, None, None)
    run = call(client, "chordbeat.trigger_schedule", name="nightly", reason="catch up")
    running(client, run["execution_id"], "s")
    cancelled = call(
        client, "chordbeat.cancel_execution", execution_id=run["execution_id"], actor="bob", reason="stuck"
    )
    assert cancelled["status"] == "cancelled"
    assert cancelled["error"] == "cancelled by bob (service): stuck"
    assert call(client, "chordbeat.get_execution", execution_id=run["execution_id"])["error"] == cancelled["error"]
    apply(client, "other")
    call(client, "chordbeat.delete_schedule", name="nightly", actor="carol")

    rows = trail(client, "nightly")
    assert [r["action"] for r in rows] == ["delete", "cancel", "trigger", "resume", "pause", "apply"]
    assert all(set(r) == AUDIT_KEYS for r in rows)
    assert {r["source"] for r in rows} == {"service"}
    assert [r["actor"] for r in rows if r["action"] in {"delete", "cancel", "pause"}] == ["carol", "bob", "alice"]
    # No actor given: the caller's Celery origin, never empty.
    defaulted = {r["actor"] for r in rows if r["action"] in {"trigger", "resume", "apply"}}
    assert len(defaulted) == 1 and defaulted.pop().startswith("service@gen")
    by_action = {r["action"]: r for r in rows}
    assert by_action["cancel"]["execution_id"] == run["execution_id"] == by_action["trigger"]["execution_id"]
    assert (by_action["cancel"]["reason"], by_action["trigger"]["reason"]) == ("stuck", "catch up")
    assert by_action["pause"]["reason"] == "bank holiday" and by_action["apply"]["detail"] == {"change": "added"}
    assert rows[0]["at"].endswith("Z") and [r["id"] for r in rows] == sorted((r["id"] for r in rows), reverse=True)
    # All schedules, newest first; a limit cuts from the newest.
    assert [r["schedule"] for r in trail(client, limit=2)] == ["nightly", "other"]
    # The execution page's rows.
    assert [r["action"] for r in service.list_audit(app, execution_id=run["execution_id"])] == ["cancel", "trigger"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"limit": 0}, "limit: must be an integer between 1 and 500, got 0"),
        ({"limit": 501}, "limit: must be an integer between 1 and 500, got 501"),
        ({"limit": True}, "limit: must be an integer between 1 and 500, got boolean"),
        ({"limit": "5"}, "limit: must be an integer between 1 and 500, got string"),
        ({"schedule": 7}, "schedule: must be a schedule name (a string), got int"),
        ({"schedule": ""}, "schedule: must be 1 to 200 characters, got 0"),
        ({"since": 1}, "since: must be an ISO 8601 time with its UTC offset"),
    ],
)
def test_list_audit_refuses_bad_arguments_naming_them(
    app: ChordbeatCelery, worker: Any, client: Celery, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(Exception, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        call(client, "chordbeat.list_audit", **kwargs)
    assert len(trail(client, limit=500)) == 0


HOSTILE = [
    ("actor", 17, "actor: must be a string, got int"),
    ("actor", True, "actor: must be a string, got boolean"),
    ("actor", ["me"], "actor: must be a string, got list"),
    ("actor", "", "actor: must be 1 to 100 characters, got 0"),
    ("actor", "   ", "actor: must not be blank"),
    ("actor", "x" * 101, "actor: must be 1 to 100 characters, got 101"),
    ("actor", "x" * 10**6, "actor: must be 1 to 100 characters, got 1000000"),
    ("actor", "eve\nadmin", "actor: must not hold control"),
    ("actor", "eve\x00", "actor: must not hold control"),
    ("actor", "\u202eadmin", "actor: must not hold control"),
    ("actor", "\ud800", "actor: must not hold control"),
    ("reason", 3.5, "reason: must be a string, got float"),
    ("reason", {"why": 1}, "reason: must be a string, got object"),
    ("reason", "r" * 501, "reason: must be 1 to 500 characters, got 501"),
    ("reason", "line\x1b[31mred", "reason: must not hold control"),
]


@pytest.mark.parametrize(
    ("field", "value", "message"), HOSTILE, ids=[f"{f}-{i}" for i, (f, _, _) in enumerate(HOSTILE)]
)
def test_hostile_actors_and_reasons_are_refused_naming_the_field_and_nothing_changes(
    app: ChordbeatCelery, worker: Any, client: Celery, field: str, value: Any, message: str
) -> None:
    apply(client, "target")
    before = trail(client, limit=500)
    for task, kwargs in [
        ("chordbeat.pause_schedule", {"name": "target"}),
        ("chordbeat.trigger_schedule", {"name": "target"}),
        ("chordbeat.delete_schedule", {"name": "target"}),
        ("chordbeat.cancel_execution", {"execution_id": 1}),
        ("chordbeat.rerun_execution", {"execution_id": 1}),
    ]:
        with pytest.raises(Exception, match="^" + message.replace("(", r"\(")) as raised:
            call(client, task, **kwargs, **{field: value})
        assert type(raised.value).__name__ == "InvalidArgument", task
    assert trail(client, limit=500) == before
    assert call(client, "chordbeat.get_schedule", name="target")["status"] == "active"
    assert call(client, "chordbeat.list_executions") == []


def test_a_source_claimed_over_the_wire_is_recorded_as_service_with_the_claim_kept_apart(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings
) -> None:
    """Anyone who can publish to the broker can send the ``chordbeat_source: cli`` header and name
    any actor: it used to be believed (source ``cli``). Now every call over the broker is
    ``service``, the claim kept in the detail as the caller's word."""
    apply(client, "marked")
    with ChordbeatClient(settings.broker_url, settings.result_backend, source="cli") as cli:
        cli.pause_schedule("marked", actor="ops@laptop", reason="deploy")
        cli.resume_schedule("marked")
    # A raw Celery client forging the CLI's header and someone else's name.
    client.send_task(
        "chordbeat.pause_schedule", kwargs={"name": "marked", "actor": "root@bastion"}, headers={SOURCE_HEADER: "cli"}
    ).get(timeout=20)
    call(client, "chordbeat.resume_schedule", name="marked")
    for claimed in ("web", "beat", "x" * 500):
        client.send_task("chordbeat.pause_schedule", kwargs={"name": "marked"}, headers={SOURCE_HEADER: claimed}).get(
            timeout=20
        )
        call(client, "chordbeat.resume_schedule", name="marked")
    rows = list(reversed(trail(client, "marked")))
    assert {r["source"] for r in rows} == {"service"} and len(rows) == 11, rows
    assert [(r["action"], (r["detail"] or {}).get("claimed_source")) for r in rows[:5]] == [
        ("apply", None),
        ("pause", "cli"),
        ("resume", "cli"),
        ("pause", "cli"),
        ("resume", None),
    ]
    assert rows[1]["actor"] == "ops@laptop" and rows[2]["actor"].startswith("service@")
    assert rows[3]["actor"] == "root@bastion"
    assert [r["detail"]["claimed_source"] for r in rows[5::2]] == ["web", "beat", "x" * 40]


def test_the_dashboard_acts_in_process_as_web(app: ChordbeatCelery, worker: Any, client: Celery) -> None:
    apply(client, "clicked")
    service.pause_schedule(app, "clicked", actor="admin", reason="noisy", source=AuditSource.WEB)
    run = service.trigger_schedule(app, "clicked", actor="admin", source=AuditSource.WEB)
    running(client, run["execution_id"], "s")
    cancelled = service.cancel_execution(app, run["execution_id"], actor="admin", source=AuditSource.WEB)
    assert cancelled["error"] == "cancelled by admin (web)"
    rows = trail(client, "clicked")
    assert [(r["action"], r["source"], r["actor"]) for r in rows[:3]] == [
        ("cancel", "web", "admin"),
        ("trigger", "web", "admin"),
        ("pause", "web", "admin"),
    ]
    with pytest.raises(InvalidArgument, match=r"^source: must be an AuditSource, got string"):
        service.pause_schedule(app, "clicked", source="web")  # type: ignore[arg-type]


def test_beat_records_its_overlap_cancels_and_timeouts(app: ChordbeatCelery, worker: Any, client: Celery) -> None:
    short = [step("s", kwargs={"seconds": 4})]  # a timed-out step is not stopped: it runs out
    apply(client, "replaced", overlap="cancel_previous", steps=short)
    first = call(client, "chordbeat.trigger_schedule", name="replaced")["execution_id"]
    running(client, first, "s")
    call(client, "chordbeat.trigger_schedule", name="replaced")
    assert finished(client, first)["status"] == "cancelled"
    rows = trail(client, "replaced")
    assert (rows[0]["action"], rows[0]["source"], rows[0]["actor"]) == ("trigger", "service", rows[0]["actor"])
    overlap = next(r for r in rows if r["action"] == "cancelled_by_overlap")
    assert (overlap["source"], overlap["actor"], overlap["execution_id"]) == ("beat", "chordbeat", first)

    apply(client, "slow", timeout=0.5, steps=short)
    late = call(client, "chordbeat.trigger_schedule", name="slow")["execution_id"]
    running(client, late, "s")
    wait_for(lambda: late in recovery.recover(app).timed_out or None, 10, interval=0.2, what="the timeout")
    timed_out = trail(client, "slow")[0]
    assert (timed_out["action"], timed_out["source"], timed_out["execution_id"]) == ("timed_out", "beat", late)


def test_beat_records_a_retry_and_the_schedule_going_dead(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    call(
        client,
        "chordbeat.apply_schedule",
        definition={"name": "flaky", "every": 1, "max_retries": 1, "steps": [step("s", "chordbeat.examples.fail")]},
    )
    with processes.beat(settings, tmp_path):
        wait_for(lambda: call(client, "chordbeat.get_schedule", name="flaky")["status"] == "dead", 40, what="dead")
    beat_rows = [r for r in reversed(trail(client, "flaky")) if r["source"] == "beat"]
    assert [r["action"] for r in beat_rows] == ["retry_scheduled", "dead"]
    assert all(r["actor"] == "chordbeat" and r["execution_id"] is not None for r in beat_rows)
    assert beat_rows[0]["detail"]["retry"] == 1 and beat_rows[1]["reason"] == "2 consecutive failures"


def test_housekeeping_keeps_the_trail_longer_than_the_history(app: ChordbeatCelery) -> None:
    now = utcnow()
    ages = {"recent": 30, "past-history": app.settings.retention_days + 1, "old": app.settings.audit_retention_days + 1}
    with transaction(app.settings.database_url) as session:
        for name, days in ages.items():
            BEAT.record(session, AuditAction.DONE, name, at=now - timedelta(days=days))
    report = housekeeping.purge(app, now=now)
    assert report.audit_rows == 1 and report.as_json()["audit_rows"] == 1
    assert [r["schedule"] for r in service.list_audit(app)] == ["past-history", "recent"]


def test_beat_records_the_schedule_file_it_applied_at_start(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    path = tmp_path / "ops.yaml"
    path.write_text(yaml.safe_dump({"schedules": [{"name": "declared", "every": 3600, "steps": [step("s")]}]}))
    with processes.beat(dataclasses.replace(settings, schedules_file=str(path)), tmp_path):
        row = wait_for(
            lambda: next((r for r in trail(client) if r["action"] == "file_applied"), None), 30, what="the file's row"
        )
    assert isinstance(row, dict)
    assert (row["source"], row["actor"], row["schedule"], row["reason"]) == (
        "beat",
        "chordbeat",
        None,
        "added declared",
    )
    assert row["detail"] == {
        "file": str(path),
        "source": "ops",
        "added": 1,
        "changed": 0,
        "removed": 0,
        "unchanged": 0,
        "kept": 0,
    }


def test_beat_records_a_schedule_done_and_an_apply_that_disables_pauses_by_its_applier(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    apply(client, "once", total_repeats=1, steps=[step("s")])
    finished(client, call(client, "chordbeat.trigger_schedule", name="once")["execution_id"])
    assert call(client, "chordbeat.get_schedule", name="once")["status"] == "done"
    done = trail(client, "once")[0]
    assert (done["action"], done["source"], done["reason"]) == ("done", "beat", "repeat limit reached after 1 runs")

    disabled = call(
        client,
        "chordbeat.apply_schedule",
        definition={"name": "off", "every": 3600, "enabled": False, "steps": [step("s")]},
        actor="dana",
    )
    assert (disabled["status"], disabled["paused_by"]) == ("paused", "dana")
    assert disabled["paused_reason"] == "enabled: false in the definition" and disabled["paused_at"] is not None
