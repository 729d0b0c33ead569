"""What operators do with alerts through the service tasks, as another service calls them: list
them, acknowledge one, silence a schedule and end the silence, send a test alert down a channel.
Each change writes its audit row in its own transaction; a bad argument is refused naming it, and
nothing is written."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import func, select, update

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.domain.times import iso
from celeryapp.monitoring.alert_outbox import write_alert
from celeryapp.recovery import housekeeping
from models import Alert, AlertDelivery, AlertKind, AlertSilence, AuditEvent, Schedule, transaction, utcnow
from tests.support import processes
from tests.support.helpers import call, finished, http_get, step, wait_for
from tests.support.receivers import HttpReceiver, http_receiver  # noqa: F401  (a fixture)
from tests.support.servers import free_port

CHANNELS_FILE = """\
channels:
  ops-webhook: {kind: webhook, url_env: OPS_WEBHOOK_URL, insecure: true}
  ops-mail: {kind: email, to: ["ops@example.com"], smtp_url_env: CHORDBEAT_SMTP_URL}
"""


@pytest.fixture
def settings(settings: Settings, tmp_path: Path) -> Settings:
    path = tmp_path / "channels.yaml"
    path.write_text(CHANNELS_FILE)
    return dataclasses.replace(settings, alert_channels_file=str(path))


def failing(client: Celery, settings: Settings, name: str) -> int:
    """A schedule paging on failure, and one failed run of it: one open ``failed`` alert."""
    definition = {"name": name, "every": 3600, "steps": [step("s", "chordbeat.examples.fail")]}
    call(client, "chordbeat.apply_schedule", definition=definition)
    with transaction(settings.database_url) as session:
        alerts = {"channels": ["ops-webhook"], "on": ["failed"]}
        session.execute(update(Schedule).where(Schedule.name == name).values(alerts=alerts))
    run: int = call(client, "chordbeat.trigger_schedule", name=name)["execution_id"]
    assert finished(client, run)["status"] == "failed"
    return run


def audit_rows(settings: Settings) -> list[AuditEvent]:
    with transaction(settings.database_url) as session:
        rows = list(session.scalars(select(AuditEvent).order_by(AuditEvent.id)))
        session.expunge_all()
        return rows


def test_an_alert_is_listed_open_until_acknowledged_and_the_acknowledgement_is_audited(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings
) -> None:
    run = failing(client, settings, "payroll")
    [alert] = call(client, "chordbeat.list_alerts", status="open")
    assert alert["id"] == f"failed/payroll/execution-{run}"
    assert (alert["kind"], alert["schedule"], alert["execution_id"]) == ("failed", "payroll", run)
    assert (alert["acknowledged_by"], alert["silenced"]) == (None, False)
    assert [(d["channel"], d["status"]) for d in alert["deliveries"]] == [("ops-webhook", "pending")]
    assert call(client, "chordbeat.get_alert", id=alert["id"]) == alert

    acked = call(client, "chordbeat.acknowledge_alert", id=alert["id"], actor="alice", reason="on it")
    assert acked["acknowledged_by"] == "alice" and acked["acknowledged_at"] is not None
    assert call(client, "chordbeat.list_alerts", status="open") == []
    assert [a["id"] for a in call(client, "chordbeat.list_alerts", status="acknowledged")] == [alert["id"]]
    assert call(client, "chordbeat.list_alerts", schedule="other") == []
    # A second acknowledgement changes nothing: the first name and time stay.
    again = call(client, "chordbeat.acknowledge_alert", id=alert["id"], actor="bob")
    assert (again["acknowledged_by"], again["acknowledged_at"]) == ("alice", acked["acknowledged_at"])

    acks = [r for r in audit_rows(settings) if r.action.value == "alert_acknowledged"]
    assert [(r.actor, r.schedule_name, r.execution_id, r.reason) for r in acks] == [
        ("alice", "payroll", run, "on it"),
        ("bob", "payroll", run, None),
    ]
    assert [r.detail for r in acks] == [
        {"alert": alert["id"], "changed": True},
        {"alert": alert["id"], "changed": False},
    ]
    # Written with the change, at its time.
    assert iso(acks[0].at) == acked["acknowledged_at"]
    with pytest.raises(Exception, match=r"^alert 'failed/nobody/x' does not exist"):
        call(client, "chordbeat.acknowledge_alert", id="failed/nobody/x")


def test_a_silenced_schedules_alerts_are_kept_unsent_until_unsilenced(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings
) -> None:
    failing(client, settings, "export")
    until = iso(utcnow() + timedelta(hours=2))
    silenced = call(
        client, "chordbeat.silence_schedule", name="export", until=until, reason="db upgrade", actor="carol"
    )
    assert silenced == {"schedule": "export", "silenced_until": until, "silenced_by": "carol", "reason": "db upgrade"}
    second = call(client, "chordbeat.trigger_schedule", name="export")["execution_id"]
    assert finished(client, second)["status"] == "failed"
    newest = call(client, "chordbeat.list_alerts", schedule="export")[0]
    assert newest["execution_id"] == second and newest["silenced"] and newest["deliveries"] == []
    assert [a["execution_id"] for a in call(client, "chordbeat.list_alerts", status="silenced")] == [second]
    # A silenced alert is no one's to acknowledge: not open.
    assert [a["execution_id"] for a in call(client, "chordbeat.list_alerts", status="open")] != [second]

    ended = call(client, "chordbeat.unsilence_schedule", name="export", actor="carol", reason="done")
    assert ended["changed"] is True and ended["silenced_until"] is None
    assert call(client, "chordbeat.unsilence_schedule", name="export")["changed"] is False
    third = call(client, "chordbeat.trigger_schedule", name="export")["execution_id"]
    assert finished(client, third)["status"] == "failed"
    newest = call(client, "chordbeat.list_alerts", schedule="export")[0]
    assert newest["execution_id"] == third and not newest["silenced"] and len(newest["deliveries"]) == 1

    rows = [r for r in audit_rows(settings) if r.action.value in {"silenced", "unsilenced"}]
    assert [(r.action.value, r.actor, r.reason, r.detail) for r in rows] == [
        ("silenced", "carol", "db upgrade", {"until": until, "replaced": False}),
        ("unsilenced", "carol", "done", {"changed": True}),
        ("unsilenced", rows[2].actor, None, {"changed": False}),
    ]
    with transaction(settings.database_url) as session:
        [silence] = session.scalars(select(AlertSilence)).all()
        assert silence.created_at == rows[0].at and silence.until == rows[1].at


def test_a_test_alert_goes_to_one_channel_and_is_audited(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings
) -> None:
    sent = call(client, "chordbeat.test_alert", channel="ops-mail", actor="dave", reason="new relay")
    assert sent["kind"] == "test" and sent["schedule"] is None and sent["id"].startswith("test/ops-mail/")
    assert sent["message"] == (
        'TEST, not an alert: chordbeat test of channel ops-mail, asked by dave (service); note: "new relay"'
    )
    assert [(d["channel"], d["status"], d["attempts"]) for d in sent["deliveries"]] == [("ops-mail", "pending", 0)]
    # Two tests are two alerts (each its own delivery to follow).
    other = call(client, "chordbeat.test_alert", channel="ops-mail")
    assert other["id"] != sent["id"]
    assert call(client, "chordbeat.list_alerts", status="open") == []
    [row, _] = [r for r in audit_rows(settings) if r.action.value == "alert_test"]
    assert (row.actor, row.schedule_name, row.reason) == ("dave", None, "new relay")
    assert row.detail == {"channel": "ops-mail", "alert": sent["id"]} and iso(row.at) == sent["at"]


HOSTILE = [
    ("chordbeat.list_alerts", {"status": "closed"}, "status: must be one of open, acknowledged, silenced, all, got"),
    ("chordbeat.list_alerts", {"status": 1}, "status: must be one of open, acknowledged, silenced, all, got int"),
    ("chordbeat.list_alerts", {"limit": 501}, "limit: must be an integer between 1 and 500, got 501"),
    ("chordbeat.list_alerts", {"schedule": 7}, "schedule: must be a schedule name (a string), got int"),
    ("chordbeat.get_alert", {"id": 5}, "id: must be an alert id (a string such as failed/nightly/2026-…Z), got int"),
    ("chordbeat.acknowledge_alert", {"id": ""}, "id: must be 1 to 400 characters, got 0"),
    ("chordbeat.acknowledge_alert", {"id": "x" * 401}, "id: must be 1 to 400 characters, got 401"),
    ("chordbeat.acknowledge_alert", {"id": "a\x1b[2Jb"}, "id: must not hold control characters"),
    ("chordbeat.acknowledge_alert", {"id": "a", "actor": "x\n"}, "actor: must not hold control"),
    ("chordbeat.silence_schedule", {"name": "s", "until": "tomorrow"}, "until: is not an ISO 8601 time"),
    ("chordbeat.silence_schedule", {"name": "s", "until": 1700000000}, "until: must be an ISO 8601 time with its"),
    ("chordbeat.silence_schedule", {"name": "s", "until": "2099-01-01T00:00:00"}, "until: must say its UTC offset"),
    ("chordbeat.silence_schedule", {"name": "s", "until": "2001-01-01T00:00:00Z"}, "until: must be in the future"),
    ("chordbeat.silence_schedule", {"name": "s", "until": "2099-01-01T00:00:00Z"}, "until: must be within 366 days"),
    ("chordbeat.silence_schedule", {"name": "s", "until": "9" * 65}, "until: must be an ISO 8601 time"),
    ("chordbeat.silence_schedule", {"name": "s"}, "arguments: missing a required argument: 'until'"),
    ("chordbeat.silence_schedule", {"name": "s", "until": "2099-01-01T00:00:00Z", "reason": "r" * 501}, "reason: "),
    ("chordbeat.unsilence_schedule", {"name": ""}, "name: must be 1 to 200 characters, got 0"),
    ("chordbeat.test_alert", {"channel": "pager"}, "channel: no channel 'pager' in "),
    ("chordbeat.test_alert", {"channel": ["ops-mail"]}, "channel: must be a channel's name (a string), got list"),
]


@pytest.mark.parametrize(("task", "kwargs", "message"), HOSTILE, ids=[f"{t}-{k}" for t, k, _ in HOSTILE])
def test_bad_arguments_are_refused_naming_the_field_and_nothing_is_written(
    app: ChordbeatCelery,
    worker: Any,
    client: Celery,
    settings: Settings,
    task: str,
    kwargs: dict[str, Any],
    message: str,
) -> None:
    with pytest.raises(Exception) as raised:
        call(client, task, **kwargs)
    assert str(raised.value).startswith(message)
    with transaction(settings.database_url) as session:
        written = [session.scalar(select(func.count()).select_from(t)) for t in (Alert, AlertSilence, AuditEvent)]
    assert written == [0, 0, 0]


def test_silencing_a_schedule_that_does_not_exist_writes_nothing(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings
) -> None:
    until = iso(utcnow() + timedelta(hours=1))
    with pytest.raises(Exception, match=r"^schedule 'ghost' does not exist"):
        call(client, "chordbeat.silence_schedule", name="ghost", until=until)
    with pytest.raises(Exception, match=r"^schedule 'ghost' does not exist"):
        call(client, "chordbeat.unsilence_schedule", name="ghost")
    assert audit_rows(settings) == []


def test_alerts_and_failed_deliveries_are_counted_by_kind_and_channel_at_the_metrics_endpoint(
    app: ChordbeatCelery,
    worker: Any,
    client: Celery,
    settings: Settings,
    tmp_path: Path,
    http_receiver: HttpReceiver,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPS_WEBHOOK_URL", http_receiver.url)
    http_receiver.fail_next = 1  # the pager is down for the first attempt
    failing(client, settings, "payroll")
    http_receiver.wait(1, status=500)
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
    assert 'chordbeat_alerts_total{kind="failed"} 1.0' in text, text
    assert 'chordbeat_alerts_total{kind="late"} 0.0' in text  # every kind from the start, for increase()
    assert 'chordbeat_alert_delivery_failures_total{channel="ops-webhook"} 1.0' in text, text


def test_housekeeping_removes_alerts_and_ended_silences_past_the_trail_s_retention(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings
) -> None:
    now = utcnow()
    kept_days = app.settings.audit_retention_days
    with transaction(settings.database_url) as session:
        for name, days in {"recent": 30, "past-history": app.settings.retention_days + 1, "old": kept_days + 1}.items():
            at = now - timedelta(days=days)
            write_alert(
                session,
                key=f"failed/{name}/execution-1",
                kind=AlertKind.FAILED,
                schedule_name=name,
                message=f"{name} failed",
                channels=["ops-webhook"],
                now=at,
            )
            session.add(AlertSilence(schedule_name=name, until=at, actor="alice", created_at=at - timedelta(hours=1)))
    report = housekeeping.purge(app, now=now)
    assert (report.alerts, report.silences) == (1, 1) and report.as_json()["alerts"] == 1
    listed = call(client, "chordbeat.list_alerts")
    assert [a["schedule"] for a in listed] == ["past-history", "recent"]
    with transaction(settings.database_url) as session:
        assert session.scalar(select(func.count()).select_from(AlertDelivery)) == 2  # the old one's went with it
        assert sorted(session.scalars(select(AlertSilence.schedule_name))) == ["past-history", "recent"]
