"""Real ``celery beat`` processes with RedBeat against real Redis."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import select

from celeryapp.app import ChordbeatCelery
from celeryapp.beat_entries import ScheduleEntry, entry_name
from celeryapp.config import Settings
from celeryapp.redis_client import get_redis
from models import ScheduleExecution, SlotOutcome, SlotRecord, transaction
from tests import processes
from tests.conftest import call, wait_for
from tests.test_lifecycle import step

pytestmark = pytest.mark.slow


def executions(app: ChordbeatCelery) -> list[ScheduleExecution]:
    with transaction(app.settings.database_url) as session:
        return list(session.scalars(select(ScheduleExecution).order_by(ScheduleExecution.id)))


def slots(app: ChordbeatCelery) -> list[SlotRecord]:
    with transaction(app.settings.database_url) as session:
        return list(session.scalars(select(SlotRecord).order_by(SlotRecord.id)))


def entry_exists(app: ChordbeatCelery, name: str) -> bool:
    key = ScheduleEntry.generate_key(app, entry_name(name))
    return bool(get_redis(app.settings.redbeat_url).exists(key))


def test_beat_fires_interval_schedules_with_one_execution_per_slot(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    call(client, "chordbeat.apply_schedule", definition={"name": "tick", "every": 1, "steps": [step("s")]})
    assert entry_exists(app, "tick")
    with processes.beat(settings, tmp_path):
        wait_for(lambda: len(executions(app)) >= 3, 30, interval=0.2, what="three fired executions")
    runs = executions(app)
    assert {e.trigger.value for e in runs} == {"interval"}
    assert len({e.run_key for e in runs}) == len(runs)
    fired = [s for s in slots(app) if s.outcome is SlotOutcome.FIRED]
    nominal = [s.nominal_at for s in fired]
    assert len(nominal) == len(set(nominal)) and all(n is not None for n in nominal)
    # Anchored slots: consecutive fires are whole intervals apart.
    gaps = {round((b - a).total_seconds(), 3) for a, b in itertools.pairwise(nominal) if a and b}
    assert gaps <= {1.0, 2.0, 3.0}


def test_pause_removes_the_entry_and_a_fire_already_sent_does_nothing(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    call(client, "chordbeat.apply_schedule", definition={"name": "p", "every": 60, "steps": [step("s")]})
    call(client, "chordbeat.pause_schedule", name="p")
    assert not entry_exists(app, "p")
    result = app.send_task("chordbeat.fire_schedule", kwargs={"name": "p"}).get(timeout=10)
    assert result == {"execution_id": None, "skipped": "schedule is paused"}
    assert [s.outcome for s in slots(app)] == [SlotOutcome.SKIPPED_PAUSED]
    call(client, "chordbeat.resume_schedule", name="p")
    assert entry_exists(app, "p")
    call(client, "chordbeat.delete_schedule", name="p")
    assert not entry_exists(app, "p")


def test_a_redelivered_fire_message_makes_one_execution(app: ChordbeatCelery, worker: Any, client: Celery) -> None:
    call(client, "chordbeat.apply_schedule", definition={"name": "once", "every": 60, "steps": [step("s")]})
    message = {"name": "once", "nominal_at": "2026-11-21T02:00:00+00:00", "trigger": "interval"}
    first = app.send_task("chordbeat.fire_schedule", kwargs=message).get(timeout=10)
    again = app.send_task("chordbeat.fire_schedule", kwargs=message).get(timeout=10)
    assert first["status"] == "in_progress"
    assert again == {"execution_id": None, "skipped": "duplicate"}
    assert len(executions(app)) == 1


def test_two_beats_fire_each_slot_once_and_a_killed_holder_is_replaced(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    call(client, "chordbeat.apply_schedule", definition={"name": "ha", "every": 1, "steps": [step("s")]})
    with processes.beat(settings, tmp_path, "beat-a") as a, processes.beat(settings, tmp_path, "beat-b") as b:
        wait_for(lambda: len(executions(app)) >= 3, 30, interval=0.2, what="fires with two beats")
        holder = wait_for(
            lambda: next((p for p in (a, b) if "Acquired lock" in p.output()), None), 10, what="a lock holder"
        )
        assert isinstance(holder, processes.Process)
        standby = b if holder is a else a
        holder.kill()
        killed_at = time.monotonic()
        before = len(executions(app))
        wait_for(lambda: len(executions(app)) > before + 1, 60, interval=0.2, what="the standby beat to take over")
        failover_s = time.monotonic() - killed_at
        assert "acquired lock" in standby.output().lower()
    print(f"\nbeat failover after SIGKILL: {failover_s:.1f}s")
    assert failover_s < 40
    runs = executions(app)
    assert len({e.run_key for e in runs}) == len(runs)
    fired = [s.nominal_at for s in slots(app) if s.outcome is SlotOutcome.FIRED]
    assert len(fired) == len(set(fired)) == len(runs)
