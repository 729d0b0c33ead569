"""Alerts are written with the fact they report, in its transaction, once per (schedule, slot, kind):
a run failing, a schedule going dead, a slot skipped by overlap, a late run ending."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import select, update

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.monitoring import metric_counts
from celeryapp.monitoring.alert_outbox import alert_key, raise_alert
from models import Alert, AlertDelivery, AlertKind, AlertSilence, MetricCount, Schedule, transaction, utcnow
from tests.support import processes
from tests.support.helpers import call, finished, running, step, wait_for

pytestmark = pytest.mark.both_databases

CHANNELS = ["ops-webhook", "ops-mail"]


def configure(settings: Settings, name: str, on: list[str], channels: list[str] = CHANNELS) -> None:
    """What a definition's ``alerts`` object stores (its validation is the definition's tests')."""
    with transaction(settings.database_url) as session:
        session.execute(update(Schedule).where(Schedule.name == name).values(alerts={"channels": channels, "on": on}))


def alerts(settings: Settings, name: str) -> list[tuple[Alert, list[AlertDelivery]]]:
    with transaction(settings.database_url) as session:
        rows = session.scalars(select(Alert).where(Alert.schedule_name == name).order_by(Alert.id)).all()
        found = []
        for alert in rows:
            deliveries = session.scalars(select(AlertDelivery).where(AlertDelivery.alert_id == alert.id)).all()
            session.expunge(alert)
            for delivery in deliveries:
                session.expunge(delivery)
            found.append((alert, sorted(deliveries, key=lambda d: d.channel)))
        return found


def counted(settings: Settings, kind: str) -> int:
    with transaction(settings.database_url) as session:
        found = session.scalar(
            select(MetricCount.count).where(MetricCount.metric == metric_counts.ALERTS, MetricCount.label == kind)
        )
        return int(found or 0)


def apply(client: Celery, name: str, task: str = "chordbeat.examples.fail", **extra: Any) -> None:
    call(
        client,
        "chordbeat.apply_schedule",
        definition={"name": name, "every": 3600, "steps": [step("s", task)], **extra},
    )


def test_a_failed_run_raises_one_failed_alert_with_a_delivery_per_channel(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings
) -> None:
    apply(client, "payroll")
    configure(settings, "payroll", ["failed", "late"])
    apply(client, "quiet")  # no alerts object: nothing is raised
    apply(client, "lateness-only")
    configure(settings, "lateness-only", ["late"])
    runs = {
        name: call(client, "chordbeat.trigger_schedule", name=name)["execution_id"]
        for name in ("payroll", "quiet", "lateness-only")
    }
    for run in runs.values():
        assert finished(client, run)["status"] == "failed"

    [(alert, deliveries)] = alerts(settings, "payroll")
    assert (alert.kind, alert.execution_id, alert.slot_at, alert.silenced) == (
        AlertKind.FAILED,
        runs["payroll"],
        None,
        False,
    )
    assert alert.key == f"failed/payroll/execution-{runs['payroll']}"
    assert alert.message.startswith(f"payroll: run {runs['payroll']} failed: ") and "says so" in alert.message
    assert [(d.channel, d.status.value, d.attempts) for d in deliveries] == [
        ("ops-mail", "pending", 0),
        ("ops-webhook", "pending", 0),
    ]
    assert alerts(settings, "quiet") == [] and alerts(settings, "lateness-only") == []
    assert counted(settings, "failed") == 1


def test_the_same_alert_decided_twice_is_written_once_and_a_silenced_one_is_kept_unsent(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings
) -> None:
    apply(client, "nightly", "chordbeat.examples.sleep")
    configure(settings, "nightly", ["late"])
    now, slot = utcnow(), utcnow().replace(microsecond=0) - timedelta(hours=1)
    late = {"schedule_name": "nightly", "kind": AlertKind.LATE, "slot_at": slot, "detail": "finish", "now": now}
    with transaction(settings.database_url) as session:
        first = raise_alert(session, message="past 06:00", **late)
        again = raise_alert(session, message="past 06:00, again", **late)
        other = raise_alert(session, message="predicted", **{**late, "detail": "predicted"})
    assert first is not None and again is None and other is not None
    assert [a.key for a, _ in alerts(settings, "nightly")] == [
        alert_key(AlertKind.LATE, "nightly", slot_at=slot, detail="finish"),
        alert_key(AlertKind.LATE, "nightly", slot_at=slot, detail="predicted"),
    ]
    with transaction(settings.database_url) as session:
        session.add(
            AlertSilence(schedule_name="nightly", until=now + timedelta(hours=1), actor="alice", reason="upgrade")
        )
        silenced = raise_alert(session, message="start", **{**late, "detail": "start"})
    assert silenced is not None
    alert, deliveries = alerts(settings, "nightly")[-1]
    assert alert.silenced and deliveries == []


def test_a_run_that_was_late_raises_resolved_when_it_ends(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings
) -> None:
    apply(client, "export", "chordbeat.examples.sleep", steps=[step("s", kwargs={"seconds": 30})])
    configure(settings, "export", ["late"])
    run = call(client, "chordbeat.trigger_schedule", name="export")["execution_id"]
    running(client, run, "s")
    with transaction(settings.database_url) as session:
        raise_alert(
            session,
            schedule_name="export",
            kind=AlertKind.LATE,
            detail="finish",
            execution_id=run,
            message="late",
            now=utcnow(),
        )
    call(client, "chordbeat.cancel_execution", execution_id=run)
    kinds = [(a.kind, a.execution_id) for a, _ in alerts(settings, "export")]
    assert kinds == [(AlertKind.LATE, run), (AlertKind.RESOLVED, run)]
    resolved = alerts(settings, "export")[-1][0]
    assert resolved.message.startswith(f"export: run {run} ended cancelled at ")
    assert [d.channel for d in alerts(settings, "export")[-1][1]] == sorted(CHANNELS)


def test_beat_raises_missed_for_slots_skipped_by_overlap_and_dead_once(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    apply(client, "busy", "chordbeat.examples.sleep", every=1, steps=[step("s", kwargs={"seconds": 60})])
    configure(settings, "busy", ["missed"])
    apply(client, "flaky", every=1, max_retries=1)
    configure(settings, "flaky", ["dead"])
    with processes.beat(settings, tmp_path):
        wait_for(lambda: len(alerts(settings, "busy")) >= 2 or None, 40, what="two skipped slots")
        wait_for(lambda: call(client, "chordbeat.get_schedule", name="flaky")["status"] == "dead", 40, what="dead")
    for run in call(client, "chordbeat.list_executions", schedule="busy", status="in_progress"):
        call(client, "chordbeat.cancel_execution", execution_id=run["id"])
    missed = alerts(settings, "busy")
    # A slot beat fires late on a loaded machine, after the next one was due, is skipped as
    # superseded: missed as well, and said so.
    details = {a.detail for a, _ in missed}
    assert {a.kind for a, _ in missed} == {AlertKind.MISSED} and "skipped_overlap" in details, details
    assert details <= {"skipped_overlap", "skipped_superseded"}, details
    assert all(
        a.slot_at is not None
        and a.key == f"missed/busy/{a.slot_at.isoformat(timespec='milliseconds').replace('+00:00', 'Z')}"
        for a, _ in missed
    )
    assert len({a.slot_at for a, _ in missed}) == len(missed)
    assert any("skipped overlap" in a.message for a, _ in missed)
    [(dead, _)] = alerts(settings, "flaky")  # the failures are not asked for: only dead
    assert (
        dead.kind is AlertKind.DEAD
        and dead.message == "flaky is dead after 2 consecutive failures; nothing runs until it is resumed"
    )
