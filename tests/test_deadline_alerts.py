"""The deadline watch with a real worker, beat, Redis and database (SQLite and PostgreSQL).

``watch()`` is called here directly with the reference clock's now, as the alert sender's thread
calls it; the schedules' ``deadlines`` and ``alerts`` are written as the definition stores them.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from sqlalchemy import select, update

from celeryapp.alerting.deadline_watch import watch
from celeryapp.application import ChordbeatCelery
from celeryapp.clock import clock
from celeryapp.config import Settings
from celeryapp.domain.times import iso
from models import Alert, AlertKind, Schedule, ScheduleExecution, Trigger, transaction
from models.tables import SLOT_RECORDS
from tests.support import processes
from tests.support.helpers import call, finished, recorded_statements, step, wait_for

pytestmark = pytest.mark.both_databases


def configure(settings: Settings, name: str, deadlines: dict[str, Any], on: list[str]) -> None:
    """What a definition's ``deadlines`` and ``alerts`` objects store (their validation is
    test_alert_fields')."""
    with transaction(settings.database_url) as session:
        session.execute(
            update(Schedule)
            .where(Schedule.name == name)
            .values(deadlines=deadlines, alerts={"channels": ["ops-webhook"], "on": on})
        )


def alerts(settings: Settings, name: str) -> list[Alert]:
    with transaction(settings.database_url) as session:
        found = session.scalars(select(Alert).where(Alert.schedule_name == name).order_by(Alert.id)).all()
        session.expunge_all()
        return list(found)


def late(settings: Settings, name: str, slot: datetime) -> dict[str | None, list[Alert]]:
    """The schedule's late, resolved and missed alerts about ``slot``, by detail (resolved: None)."""
    found: dict[str | None, list[Alert]] = {}
    for alert in alerts(settings, name):
        if alert.slot_at == slot:
            found.setdefault(alert.detail, []).append(alert)
    return found


def watched(settings: Settings, name: str, slot: datetime, detail: str, timeout: float) -> None:
    """Run the watch until it raised the ``detail`` alert about ``slot``."""

    def raised() -> object:
        watch(settings.database_url, clock.now())
        return late(settings, name, slot).get(detail)

    wait_for(raised, timeout, interval=0.1, what=f"late/{detail} about {slot}")


def slot_run(settings: Settings, name: str) -> tuple[int, datetime, datetime] | None:
    """(id, started_at, slot) of the schedule's first run that beat fired, once there is one."""
    with transaction(settings.database_url) as session:
        row = session.execute(
            select(ScheduleExecution.id, ScheduleExecution.started_at, SLOT_RECORDS.c.nominal_at)
            .join(SLOT_RECORDS, SLOT_RECORDS.c.execution_id == ScheduleExecution.id)
            .where(ScheduleExecution.schedule_name == name, ScheduleExecution.trigger == Trigger.INTERVAL)
            .order_by(ScheduleExecution.id)
            .limit(1)
        ).first()
    return None if row is None else (row[0], row[1], row[2])


@pytest.mark.timeout(120)
def test_a_run_on_course_to_miss_its_deadline_is_reported_before_it_when_it_passes_and_when_it_ends(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    url = settings.database_url

    def apply(seconds: float) -> None:
        definition = {"name": "export", "every": 4, "steps": [step("s", kwargs={"seconds": seconds})]}
        call(client, "chordbeat.apply_schedule", definition=definition)

    # Three earlier runs; their durations made a minute long, as a slow week's would be.
    apply(0.1)
    for _ in range(3):
        run = call(client, "chordbeat.trigger_schedule", name="export")["execution_id"]
        assert finished(client, run)["status"] == "completed"
    with transaction(url) as session:
        for earlier in session.scalars(select(ScheduleExecution).where(ScheduleExecution.schedule_name == "export")):
            assert earlier.completed_at is not None
            earlier.started_at = earlier.completed_at - timedelta(seconds=60)
    apply(12)
    configure(settings, "export", {"finish_within": 8}, ["late"])
    with processes.beat(settings, tmp_path):
        found = wait_for(lambda: slot_run(settings, "export"), 30, what="a run fired by beat")
        assert isinstance(found, tuple)
        run, started, slot = found
        deadline = slot + timedelta(seconds=8)
        watched(settings, "export", slot, "predicted", 10)
        [predicted] = late(settings, "export", slot)["predicted"]
        assert predicted.at < deadline and predicted.execution_id == run
        assert predicted.expected_at is not None and predicted.expected_at > deadline
        assert abs((predicted.expected_at - (started + timedelta(seconds=60))).total_seconds()) < 1
        assert f"expected to finish at {iso(predicted.expected_at, timespec='seconds')}" in predicted.message
        assert "finish" not in late(settings, "export", slot)  # not yet: the deadline has not passed

        watched(settings, "export", slot, "finish", 15)
        [finish] = late(settings, "export", slot)["finish"]
        assert finish.at >= deadline and finish.execution_id == run and "still running" in finish.message
        watch(url, clock.now())
        assert finished(client, run, timeout=20)["status"] == "completed"

    about = late(settings, "export", slot)
    assert [len(about[detail]) for detail in ("predicted", "finish")] == [1, 1]
    assert [a.kind for a in about[None]] == [AlertKind.RESOLVED] and about[None][0].execution_id == run
    for other in call(client, "chordbeat.list_executions", schedule="export", status="in_progress"):
        call(client, "chordbeat.cancel_execution", execution_id=other["id"])


@pytest.mark.timeout(120)
def test_a_deadline_passing_while_beat_is_down_raises_late_and_missed_once_and_none_when_paused(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    url = settings.database_url
    for name in ("nightly", "held"):
        definition = {"name": name, "every": 3, "steps": [step("s", kwargs={"seconds": 0.1})]}
        call(client, "chordbeat.apply_schedule", definition=definition)
        configure(settings, name, {"start_within": 1, "finish_within": 2}, ["late", "missed"])
    call(client, "chordbeat.pause_schedule", name="held")

    beat = processes.start_beat(settings, tmp_path)
    try:
        wait_for(lambda: slot_run(settings, "nightly"), 30, what="a run fired by beat")
    finally:
        beat.kill()
    with transaction(url) as session:
        unfired = session.scalar(select(Schedule.next_run_at).where(Schedule.name == "nightly"))
    assert unfired is not None

    def raised() -> object:
        watch(url, clock.now(), missed_grace_s=2)
        about = late(settings, "nightly", unfired)
        return {"start", "finish", "not_fired"} <= set(about) or None

    wait_for(raised, 20, interval=0.1, what="late and missed alerts of the slot beat did not fire")
    about = late(settings, "nightly", unfired)
    [start], [finish], [missed] = about["start"], about["finish"], about["not_fired"]
    assert start.kind is AlertKind.LATE and start.execution_id is None and "has not started a run" in start.message
    assert finish.kind is AlertKind.LATE and "has no run" in finish.message
    assert missed.kind is AlertKind.MISSED and missed.key == f"missed/nightly/{iso(unfired)}"
    assert "has not fired" in missed.message

    # The same pass twice writes once; a paused schedule gets nothing.
    now = clock.now()
    watch(url, now, missed_grace_s=2)
    before = [a.key for a in alerts(settings, "nightly")]
    assert watch(url, now, missed_grace_s=2) == 0
    assert [a.key for a in alerts(settings, "nightly")] == before
    assert alerts(settings, "held") == []

    # Beat back: the slots it did not fire are recorded missed, the reported one not again.
    with processes.beat(settings, tmp_path, "beat-again"):
        wait_for(
            lambda: any(a.detail == "missed" for a in alerts(settings, "nightly")), 30, what="beat's missed records"
        )
    missed_of_slot = [a for a in alerts(settings, "nightly") if a.key == f"missed/nightly/{iso(unfired)}"]
    assert len(missed_of_slot) == 1
    assert alerts(settings, "held") == []


def test_a_pass_costs_the_same_statements_for_one_schedule_or_many(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings
) -> None:
    def apply(name: str) -> None:
        definition = {"name": name, "every": 3600, "steps": [step("s", kwargs={"seconds": 0.1})]}
        call(client, "chordbeat.apply_schedule", definition=definition)
        configure(settings, name, {"start_within": 60, "finish_by": "06:00"}, ["late", "missed"])

    def cost() -> list[str]:
        with recorded_statements(app) as statements:
            assert watch(settings.database_url, clock.now()) == 0
        return statements

    apply("first")
    call(client, "chordbeat.apply_schedule", definition={"name": "quiet", "every": 3600, "steps": [step("s")]})
    one = cost()
    for number in range(30):
        apply(f"more-{number}")
    # The schedules with alerts, then the runs in progress of those with deadlines (none is due).
    assert cost() == one and [s for s in one if s not in ("COMMIT", "ROLLBACK")] == ["SELECT", "SELECT"]


def test_finish_by_is_a_wall_clock_time_in_the_schedules_zone(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings
) -> None:
    definition = {"name": "hr-sync", "cron": "0 5 * * *", "timezone": "Europe/London", "steps": [step("s")]}
    call(client, "chordbeat.apply_schedule", definition=definition)
    configure(settings, "hr-sync", {"start_within": 600, "finish_by": "06:00"}, ["late"])
    with transaction(settings.database_url) as session:
        slot = session.scalar(select(Schedule.next_run_at).where(Schedule.name == "hr-sync"))
    assert slot is not None
    six = (slot + timedelta(hours=1)).astimezone(ZoneInfo("Europe/London"))
    assert (six.hour, six.minute) == (6, 0)

    # Judged by the now it is given (the reference clock's, in production).
    assert watch(settings.database_url, slot + timedelta(seconds=599)) == 0
    assert watch(settings.database_url, slot + timedelta(seconds=600)) == 1
    assert watch(settings.database_url, slot + timedelta(minutes=59, seconds=59)) == 0
    assert watch(settings.database_url, slot + timedelta(hours=1)) == 1
    about = late(settings, "hr-sync", slot)
    assert sorted(about) == ["finish", "start"]
    assert f"had to finish by {iso(slot + timedelta(hours=1), timespec='seconds')}" in about["finish"][0].message


def test_slots_on_days_the_calendar_excludes_are_never_reported_and_an_unreadable_calendar_is(
    app: ChordbeatCelery,
    worker: Any,
    client: Celery,
    settings: Settings,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = settings.database_url
    directory = tmp_path / "calendars"
    directory.mkdir()
    names = ("plain", "inline", "named", "unreadable")
    for name in names:
        definition = {"name": name, "cron": "0 18 * * *", "timezone": "Europe/London", "steps": [step("s")]}
        call(client, "chordbeat.apply_schedule", definition=definition)
        configure(settings, name, {"start_within": 600, "finish_within": 3600}, ["late", "missed"])
    with transaction(url) as session:
        slot = session.scalar(select(Schedule.next_run_at).where(Schedule.name == "plain"))
    assert slot is not None
    day = slot.astimezone(ZoneInfo("Europe/London")).date().isoformat()
    (directory / "plant").write_text(f"# the plant is closed\n{day}\n")
    # As the definition stores a calendar (its validation and apply's file check: test_calendar_fields').
    calendars = {"inline": {"exclude": [day]}, "named": {"calendars": ["plant"]}, "unreadable": {"calendars": ["gone"]}}
    with transaction(url) as session:
        for name, calendar in calendars.items():
            stored = {"exclude": [], "calendars": [], "on_excluded": "skip", **calendar}
            session.execute(update(Schedule).where(Schedule.name == name).values(calendar=stored))

    # Beat down over the excluded day: no run was expected, nobody is paged; a calendar that cannot
    # be read pages as if it had none, and says so in the log.
    caplog.set_level(logging.ERROR, logger="celeryapp.alerting.deadline_watch")
    assert watch(url, slot + timedelta(hours=2), missed_grace_s=60, calendars_dir=str(directory)) == 6
    for name in ("plain", "unreadable"):
        assert set(late(settings, name, slot)) == {"start", "finish", "not_fired"}, name
    assert alerts(settings, "inline") == [] and alerts(settings, "named") == []
    assert "unreadable: its calendar cannot be read" in caplog.text and "no file gone" in caplog.text

    # Still down the next day, which runs: its slot is reported, the excluded one still not.
    following = slot + timedelta(days=1)
    watch(url, following + timedelta(hours=2), missed_grace_s=60, calendars_dir=str(directory))
    for name in ("inline", "named"):
        assert late(settings, name, slot) == {}, name
        assert set(late(settings, name, following)) == {"start", "finish", "not_fired"}, name
        [missed] = late(settings, name, following)["not_fired"]
        assert missed.key == f"missed/{name}/{iso(following)}"
