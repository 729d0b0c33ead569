"""Real ``celery beat`` processes with RedBeat against real Redis."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import select, update

from celeryapp import app as chordbeat_app
from celeryapp import outcome
from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.context import current_step
from celeryapp.domain.cadence import Cadence, cadence_of
from celeryapp.domain.names import CONTROL_QUEUE
from celeryapp.domain.times import iso
from celeryapp.interfaces import service
from celeryapp.interfaces.web.health_lines import beat_lock_line
from celeryapp.messaging import keys
from celeryapp.messaging.redis_client import get_redis
from celeryapp.monitoring.health import age_s
from celeryapp.scheduling import beat_entries
from celeryapp.scheduling.beat import ChordbeatScheduler
from celeryapp.scheduling.beat_entries import CadenceSchedule, ScheduleEntry, entry_name
from celeryapp.scheduling.stored_entry import FIRE_EXPIRY_GRACE, aware
from celeryapp.worker import firing
from models import ExecutionStatus, Schedule, SlotOutcome, SlotRecord, Trigger, transaction, utcnow
from tests.support import processes
from tests.support.helpers import call, entry_exists, executions, finished, fire_messages, step, wait_for

pytestmark = pytest.mark.slow

CHORDBEAT = str(Path(sys.executable).with_name("chordbeat"))


def slots(app: ChordbeatCelery) -> list[SlotRecord]:
    with transaction(app.settings.database_url) as session:
        return list(session.scalars(select(SlotRecord).order_by(SlotRecord.id)))


def stored_schedule(app: ChordbeatCelery, name: str) -> Schedule:
    with transaction(app.settings.database_url) as session:
        schedule = session.scalar(select(Schedule).where(Schedule.name == name))
        assert schedule is not None
        return schedule


@chordbeat_app.task(name="tests.fails_first_then_ok")
def fails_first_then_ok(counter: str) -> dict[str, Any]:
    """Fails the first time it runs for ``counter``, then completes; ``hold`` in the payload: sleeps
    that long first (and counts for nothing), so a manual run can stand in the way."""
    context = current_step()
    assert context is not None
    hold = float(context.payload.get("hold", 0))
    deadline = time.monotonic() + hold
    while time.monotonic() < deadline:
        time.sleep(0.1)
    if hold:
        return outcome.completed("held")
    if get_redis(chordbeat_app.settings.broker_url).incr(f"tests:{counter}") == 1:
        raise RuntimeError("the first run fails")
    return outcome.completed("ok")


def fails_first(counter: str) -> dict[str, Any]:
    return {"name": "s", "task": "tests.fails_first_then_ok", "kwargs": {"counter": counter}}


def test_beat_fires_interval_schedules_with_one_execution_per_slot(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    call(client, "chordbeat.apply_schedule", definition={"name": "tick", "every": 1, "steps": [step("s")]})
    assert entry_exists(app, "tick")
    with processes.beat(settings, tmp_path):
        wait_for(lambda: len(executions(app)) >= 3, 30, interval=0.2, what="three fired executions")
        beat_age = age_s(settings, "beat")
        assert beat_age is not None and beat_age < 10, "beat keeps its liveness file fresh"
        # A changed definition: the fires after it pin version 2, those before stay on version 1.
        changed = {"name": "tick", "every": 1, "steps": [step("s"), step("t")]}
        assert call(client, "chordbeat.apply_schedule", definition=changed)["version"] == 2
        wait_for(lambda: executions(app)[-1].version == 2, 30, interval=0.2, what="a fire of version 2")
    runs = executions(app)
    versions = [e.version for e in runs]
    assert versions[:3] == [1, 1, 1] and versions == sorted(versions) and set(versions) == {1, 2}, versions
    assert {e.trigger.value for e in runs} == {"interval"}
    assert len({e.run_key for e in runs}) == len(runs)
    fired = [s for s in slots(app) if s.outcome is SlotOutcome.FIRED]
    nominal = [s.nominal_at for s in fired]
    assert len(nominal) == len(set(nominal)) and all(n is not None for n in nominal)
    # Anchored slots: consecutive fires are whole intervals apart, on each side of the change
    # (an interval is anchored at its definition's last change: docs/architecture.md).
    anchor = aware(stored_schedule(app, "tick").changed_at)
    for side in ([n for n in nominal if n and aware(n) < anchor], [n for n in nominal if n and aware(n) >= anchor]):
        gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(side)]
        assert all(g >= 1 and g == round(g) for g in gaps), gaps
    assert len(nominal) >= 4


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
    # A changed cadence rewrites the entry at once.
    call(client, "chordbeat.apply_schedule", definition={"name": "p", "every": 15, "steps": [step("s")]})
    entry = ScheduleEntry.from_key(ScheduleEntry.generate_key(app, entry_name("p")), app=app)
    assert entry.schedule.cadence.every_s == 15
    call(client, "chordbeat.delete_schedule", name="p")
    assert not entry_exists(app, "p")


def test_a_redelivered_fire_message_makes_one_execution(app: ChordbeatCelery, worker: Any, client: Celery) -> None:
    call(client, "chordbeat.apply_schedule", definition={"name": "once", "every": 60, "steps": [step("s")]})
    # The interval's anchor is a slot, and the latest one until a minute has passed.
    latest = stored_schedule(app, "once").updated_at
    message = {"name": "once", "nominal_at": latest.isoformat(), "trigger": "interval"}
    first = app.send_task("chordbeat.fire_schedule", kwargs=message).get(timeout=10)
    again = app.send_task("chordbeat.fire_schedule", kwargs=message).get(timeout=10)
    assert first["status"] == "in_progress"
    assert again == {"execution_id": None, "skipped": "duplicate"}
    assert len(executions(app)) == 1
    stale_retry = {**message, "trigger": "retry"}
    assert app.send_task("chordbeat.fire_schedule", kwargs=stale_retry).get(timeout=10) == {
        "execution_id": None,
        "skipped": "no retry is pending",
    }
    assert len(executions(app)) == 1


@pytest.mark.timeout(120)
def test_two_beats_fire_each_slot_once_and_a_killed_holder_is_replaced(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    call(client, "chordbeat.apply_schedule", definition={"name": "ha", "every": 1, "steps": [step("s")]})
    with processes.beat(settings, tmp_path, "beat-a") as a, processes.beat(settings, tmp_path, "beat-b") as b:
        wait_for(lambda: len(executions(app)) >= 3, 30, interval=0.2, what="fires with two beats")
        holder = wait_for(
            lambda: next((p for p in (a, b) if "acquired lock" in p.output()), None), 10, what="a lock holder"
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


def schedule_of(client: Celery, name: str) -> dict[str, Any]:
    result: dict[str, Any] = call(client, "chordbeat.get_schedule", name=name)
    return result


def test_failures_are_retried_with_backoff_then_the_schedule_dies(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    call(
        client,
        "chordbeat.apply_schedule",
        definition={"name": "flaky", "every": 1, "max_retries": 2, "steps": [step("s", "chordbeat.examples.fail")]},
    )
    with processes.beat(settings, tmp_path):
        wait_for(lambda: schedule_of(client, "flaky")["status"] == "dead", 40, interval=0.2, what="dead")
    runs = executions(app)
    assert [e.trigger.value for e in runs] == ["interval", "retry", "retry"]
    assert all(e.status.value == "failed" for e in runs)
    # Backoff: retry 1 after 1 s (base = every), retry 2 after 2 s.
    gaps = [(b.started_at - a.completed_at).total_seconds() for a, b in itertools.pairwise(runs) if a.completed_at]
    assert 0.9 <= gaps[0] < 4 and 1.9 <= gaps[1] < 5, gaps
    schedule = schedule_of(client, "flaky")
    assert schedule["error_count"] == 3 and schedule["next_run_at"] is None
    assert not entry_exists(app, "flaky")
    # Regular slots that came due while a retry was pending are recorded as replaced by it (or,
    # when the machine lags a whole interval behind, as superseded by the next one).
    assert {s.outcome for s in slots(app)} <= {SlotOutcome.FIRED, SlotOutcome.RETRY, SlotOutcome.SKIPPED_SUPERSEDED}


def test_total_repeats_ends_the_schedule_as_done(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    call(
        client,
        "chordbeat.apply_schedule",
        definition={"name": "twice", "every": 1, "total_repeats": 2, "steps": [step("s")]},
    )
    with processes.beat(settings, tmp_path):
        wait_for(lambda: schedule_of(client, "twice")["status"] == "done", 30, interval=0.2, what="done")
    schedule = schedule_of(client, "twice")
    assert schedule["run_count"] == 2 and schedule["next_run_at"] is None
    assert not entry_exists(app, "twice")
    assert [e.status.value for e in executions(app)] == ["completed", "completed"]


def test_a_slot_whose_fire_message_was_lost_is_fired_again_once(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    # An hourly slot two minutes ago: the latest slot, past the re-fire grace.
    slot = (datetime.now(UTC) - timedelta(minutes=2)).replace(second=0, microsecond=0)
    definition = {"name": "lost-fire", "cron": f"{slot.minute} * * * *", "steps": [step("s")]}
    call(client, "chordbeat.apply_schedule", definition=definition)
    key = ScheduleEntry.generate_key(app, entry_name("lost-fire"))

    def overdue_by_database() -> None:
        with transaction(app.settings.database_url) as session:
            session.execute(update(Schedule).values(next_run_at=slot))

    # Beat has not reached the slot (down or behind): it will fire it itself; nothing is re-fired.
    ScheduleEntry.from_key(key, app=app).reschedule(last_run_at=slot - timedelta(seconds=5))
    overdue_by_database()
    assert app.send_task("chordbeat.reconcile_beat").get(timeout=10)["refired"] == []
    # Beat moved past the slot (it recorded the fire) but the message never arrived: re-fired.
    ScheduleEntry.from_key(key, app=app).reschedule(last_run_at=slot + timedelta(seconds=1))
    assert app.send_task("chordbeat.reconcile_beat").get(timeout=10)["refired"] == ["lost-fire"]
    run = wait_for(lambda: executions(app), 10, what="the re-fired run")
    assert isinstance(run, list) and run[0].run_key == f"lost-fire:cron:{iso(slot)}"
    # The slot is now known as fired: the next reconcile leaves it alone.
    assert app.send_task("chordbeat.reconcile_beat").get(timeout=10)["refired"] == []


def test_a_retry_whose_fire_message_was_lost_is_fired_again_once(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    definition = {"name": "lost-retry", "every": 3600, "max_retries": 2, "steps": [fails_first("lost-retry")]}
    call(client, "chordbeat.apply_schedule", definition=definition)
    manual = call(client, "chordbeat.trigger_schedule", name="lost-retry")
    assert finished(client, manual["execution_id"])["status"] == "failed"
    assert stored_schedule(app, "lost-retry").retry_at is not None
    # As if retry 1 came due two minutes ago and beat fired it, but the message never arrived.
    due = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=2)
    with transaction(app.settings.database_url) as session:
        session.execute(update(Schedule).values(retry_at=due))
    key = ScheduleEntry.generate_key(app, entry_name("lost-retry"))
    ScheduleEntry.from_key(key, app=app).reschedule(last_run_at=due + timedelta(seconds=1))
    assert app.send_task("chordbeat.reconcile_beat").get(timeout=10)["refired"] == ["lost-retry"]
    retry = wait_for(lambda: [e for e in executions(app) if e.trigger is Trigger.RETRY], 10, what="the retry")
    assert isinstance(retry, list) and retry[0].run_key == f"lost-retry:retry1:{iso(due)}"
    assert finished(client, retry[0].id)["status"] == "completed"
    # It ran: the retry is over, nothing is re-fired again, the regular cadence is back.
    assert stored_schedule(app, "lost-retry").retry_at is None
    assert app.send_task("chordbeat.reconcile_beat").get(timeout=10)["refired"] == []
    assert [e.trigger for e in executions(app)] == [Trigger.MANUAL, Trigger.RETRY]


def test_a_retry_due_while_beat_entries_were_lost_still_runs(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    definition = {
        "name": "wiped",
        "cron": "0 0 1 1 *",
        "retry_delay": 1,
        "max_retries": 1,
        "steps": [fails_first("wiped")],
    }
    call(client, "chordbeat.apply_schedule", definition=definition)
    manual = call(client, "chordbeat.trigger_schedule", name="wiped")
    assert finished(client, manual["execution_id"])["status"] == "failed"
    retry_at = stored_schedule(app, "wiped").retry_at
    assert retry_at is not None
    # No beat runs while the retry comes due, and Redis loses beat's entries meanwhile.
    wait_for(lambda: datetime.now(UTC) > retry_at, 10, interval=0.1, what="the retry to come due")
    redbeat = get_redis(app.settings.redbeat_url)
    lost = list(redbeat.scan_iter(match=app.conf.redbeat_key_prefix + "*"))
    assert lost
    redbeat.delete(*lost)
    with processes.beat(settings, tmp_path):
        retry = wait_for(
            lambda: [e for e in executions(app) if e.trigger is Trigger.RETRY], 30, interval=0.2, what="the retry"
        )
    assert isinstance(retry, list) and len(retry) == 1
    assert finished(client, retry[0].id)["status"] == "completed"
    assert stored_schedule(app, "wiped").retry_at is None


@pytest.mark.timeout(120)
def test_a_retry_that_met_a_manual_run_runs_once_when_it_ends_and_the_cadence_resumes(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    definition = {"name": "blocked", "every": 4, "max_retries": 2, "steps": [fails_first("blocked")]}
    call(client, "chordbeat.apply_schedule", definition=definition)
    with processes.beat(settings, tmp_path):
        wait_for(lambda: schedule_of(client, "blocked")["current_retry"] == 1, 30, interval=0.1, what="a failure")
        # Retry 1 is due 4 s after the failure; a long manual run is in its way.
        manual = call(client, "chordbeat.trigger_schedule", name="blocked", payload={"hold": 60})
        assert manual.get("status") == "in_progress", manual
        wait_for(
            lambda: [s for s in slots(app) if s.trigger is Trigger.RETRY], 30, interval=0.2, what="the retry's fire"
        )
        call(client, "chordbeat.cancel_execution", execution_id=manual["execution_id"])
        # The retry runs when the manual run ends; then regular slots run again.
        wait_for(
            lambda: (Trigger.INTERVAL, ExecutionStatus.COMPLETED) in [(e.trigger, e.status) for e in executions(app)],
            40,
            interval=0.2,
            what="a regular run after the retry",
        )
    runs = [(e.trigger, e.status) for e in executions(app)]
    assert runs[:3] == [
        (Trigger.INTERVAL, ExecutionStatus.FAILED),
        (Trigger.MANUAL, ExecutionStatus.CANCELLED),
        (Trigger.RETRY, ExecutionStatus.COMPLETED),
    ], runs
    assert {trigger for trigger, _ in runs[3:]} == {Trigger.INTERVAL}
    waited = [s for s in slots(app) if s.trigger is Trigger.RETRY and s.outcome is not SlotOutcome.FIRED]
    assert [s.outcome for s in waited] == [SlotOutcome.BUFFERED]
    assert waited[0].detail == f"execution {manual['execution_id']} is in progress; retry 1 runs when it ends"
    assert schedule_of(client, "blocked")["current_retry"] == 0


def queued_fires(app: ChordbeatCelery) -> list[tuple[datetime, datetime]]:
    """(nominal slot, expiry) of the fires waiting in the control queue (one schedule: a message each)."""
    fires = []
    for slots_, expires in fire_messages(app):
        assert len(slots_) == 1 and expires is not None
        fires.append((datetime.fromisoformat(slots_[0]["nominal_at"]), datetime.fromisoformat(expires)))
    return fires


def passed_slot(app: ChordbeatCelery, name: str) -> datetime | None:
    """The last slot beat moved ``name``'s entry past (fired or not)."""
    meta = get_redis(app.settings.redbeat_url).hget(ScheduleEntry.generate_key(app, entry_name(name)), "meta")
    return aware(ScheduleEntry.decode_meta(meta)["last_run_at"]) if meta else None


@pytest.mark.timeout(120)
def test_after_a_worker_outage_a_schedule_runs_once_then_keeps_its_cadence(
    app: ChordbeatCelery, settings: Settings, tmp_path: Path
) -> None:
    """Without a control worker beat passes slot after slot, but its first fire stays the only one
    queued (before: a fire per slot piled up in Redis, expired only once a worker read it). When a
    worker takes it, beat fires the latest slot it passed meanwhile: that one runs at once."""
    service.apply_schedule(app, {"name": "outage", "every": 4, "overlap": "allow", "steps": [step("s")]})
    cadence = cadence_of(stored_schedule(app, "outage"))
    most_queued = 0

    def count_queued() -> int:
        nonlocal most_queued
        most_queued = max(most_queued, len(queued_fires(app)))
        return most_queued

    with processes.beat(settings, tmp_path) as beat:
        wait_for(count_queued, 30, interval=0.2, what="a first fire")
        first = queued_fires(app)[0][0]
        wait_for(
            lambda: count_queued() and (passed_slot(app, "outage") or first) >= first + timedelta(seconds=8),
            60,
            interval=0.2,
            what="beat to pass 2 more slots",
        )
        assert most_queued == 1, beat.output()[-3000:]
        assert "still queued (is a control worker running?); not fired again" in beat.output()
        backlog = queued_fires(app)
        for nominal, expires in backlog:
            expected = cadence.slot_after(nominal) + FIRE_EXPIRY_GRACE
            assert abs(expires - expected) < timedelta(milliseconds=1), (nominal, expires)
        with processes.worker(settings, tmp_path):
            wait_for(
                lambda: len([s for s in slots(app) if s.outcome is SlotOutcome.FIRED]) > 1,
                60,
                interval=0.2,
                what="the cadence to resume",
            )
    records = {s.nominal_at: s for s in slots(app)}
    assert all(nominal in records for nominal, _ in backlog), "every queued fire was taken and recorded"
    # When the first worker took the first fire, every slot up to then had been missed: each is
    # recorded (the queued fire's superseded, the ones never fired missed).
    drained_at = min(s.recorded_at for s in records.values())
    passed, slot = [], first
    while slot < drained_at - timedelta(seconds=1):
        passed.append(slot)
        slot = cadence.slot_after(slot)
    assert [p for p in passed if p not in records] == []
    missed = [s for s in records.values() if s.nominal_at is not None and s.nominal_at <= drained_at]
    ran = len([s for s in missed if s.outcome is SlotOutcome.FIRED])
    # Not run: superseded by a newer slot, or recorded as missed by the newer slot's fire first.
    superseded = len([s for s in missed if s.outcome in (SlotOutcome.SKIPPED_SUPERSEDED, SlotOutcome.MISSED)])
    print(f"\nworker outage: {len(missed)} missed slots, {ran} ran, {superseded} superseded")
    # The latest slot passed runs (its fire was held while the first one waited), none older.
    assert len(missed) > len(backlog) and ran == 1 and superseded == len(missed) - ran
    first_run = min(e.started_at for e in executions(app))
    assert first_run - drained_at < timedelta(seconds=3), "the cadence resumes at once"
    by_id = {e.id: e for e in executions(app)}
    for record in records.values():
        if record.outcome is SlotOutcome.FIRED:
            assert record.nominal_at is not None and record.execution_id is not None
            started = by_id[record.execution_id].started_at
            assert started < cadence.slot_after(record.nominal_at), "a run started for a slot already superseded"


def test_a_fire_message_dropped_unread_holds_no_schedule_back(app: ChordbeatCelery, worker: Any) -> None:
    """A worker drops an expired fire message without running it: its queued marker goes too, or
    beat would send no fire for its schedules until the marker expired (a day)."""
    marker = keys.queued_fire_key("expired-fire")
    client = get_redis(app.settings.broker_url)
    client.set(marker, "1", ex=60)
    fire = {"name": "gone", "nominal_at": iso(utcnow() - timedelta(minutes=5)), "trigger": "interval"}
    app.send_task(
        "chordbeat.fire_batch",
        kwargs={"fires": [fire]},
        queue=CONTROL_QUEUE,
        task_id="expired-fire",
        expires=utcnow() - timedelta(seconds=1),
    )
    wait_for(lambda: not client.exists(marker), 20, what="the dropped message's marker to go")
    assert slots(app) == []  # dropped unread: it fired nothing


def test_after_beat_downtime_a_schedule_runs_once_then_keeps_its_cadence(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    from datetime import UTC, datetime, timedelta

    call(client, "chordbeat.apply_schedule", definition={"name": "downtime", "every": 1, "steps": [step("s")]})
    with processes.beat(settings, tmp_path, "beat-1") as first:
        wait_for(lambda: executions(app), 30, interval=0.2, what="a first fire")
        first.kill()
    stopped = datetime.now(UTC)
    # As after an outage longer than the lock's 30 s: the dead beat's lock is gone.
    get_redis(app.settings.redbeat_url).delete(app.conf.redbeat_key_prefix + ":lock")
    # The outage: wait until at least four slots have passed with no beat running.
    wait_for(lambda: datetime.now(UTC) - stopped > timedelta(seconds=4), 10, interval=0.2, what="missed slots")
    fired_before = len([s for s in slots(app) if s.outcome is SlotOutcome.FIRED])
    with processes.beat(settings, tmp_path, "beat-2"):
        restarted = datetime.now(UTC)
        wait_for(
            lambda: len([s for s in slots(app) if s.outcome is SlotOutcome.FIRED]) >= fired_before + 3,
            30,
            interval=0.2,
            what="fires after the restart",
        )
    after = [s.nominal_at for s in slots(app) if s.outcome is SlotOutcome.FIRED][fired_before:]
    assert all(n is not None for n in after)
    # No make-up runs: nothing fired for the slots of the outage, except the latest one.
    in_outage = [n for n in after if n and stopped + timedelta(seconds=1) < n < restarted - timedelta(seconds=1)]
    assert in_outage == [], in_outage
    assert len(after) == len(set(after))


def test_slots_no_fire_processed_are_recorded_as_missed_by_the_next_fire(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    """A fire message lost with a killed worker (or beat down) still leaves an answer to "why not at 02:00?"."""
    call(client, "chordbeat.apply_schedule", definition={"name": "gappy", "every": 60, "steps": [step("s")]})
    anchor = utcnow() - timedelta(seconds=270)  # slots at anchor + 0..4 min are due, + 5 min is not yet
    with transaction(app.settings.database_url) as session:
        session.execute(update(Schedule).where(Schedule.name == "gappy").values(updated_at=anchor))

    def fire(minutes: int) -> dict[str, Any]:
        slot = anchor + timedelta(minutes=minutes)
        message = {"name": "gappy", "nominal_at": slot.isoformat(), "trigger": "interval"}
        answer: dict[str, Any] = app.send_task("chordbeat.fire_schedule", kwargs=message).get(timeout=10)
        return answer

    fire(0)
    # The fires of the next three slots never arrive; the fourth's does.
    assert fire(4)["status"] == "in_progress"
    # One of the lost ones turns up late after all: it changes nothing and records nothing more.
    assert fire(2)["execution_id"] is None
    records = sorted((s.nominal_at, s.outcome) for s in slots(app) if s.schedule_name == "gappy")
    assert [outcome for _, outcome in records] == [
        SlotOutcome.SKIPPED_SUPERSEDED,  # anchor + 0: processed once the next slot was already due
        SlotOutcome.MISSED,
        SlotOutcome.MISSED,
        SlotOutcome.MISSED,
        SlotOutcome.FIRED,
    ], records
    assert [at for at, _ in records] == [anchor + timedelta(minutes=m) for m in range(5)]


def test_slots_a_retry_replaced_before_their_fires_came_are_recorded(app: ChordbeatCelery) -> None:
    """A run failed after a slot was due but before its fire was processed (the control workers
    were busy or down); its retry fired first. The retry replaces that slot's run, and says so:
    found by the chaos test (seed 165042), where the slot had neither a run nor a record."""
    definition = {"name": "retried", "every": 60, "max_retries": 2, "steps": [step("s")]}
    service.apply_schedule(app, definition)
    anchor = utcnow() - timedelta(seconds=150)  # slots at anchor + 0, 1, 2 min are due
    retry_at = anchor + timedelta(seconds=130)
    with transaction(app.settings.database_url) as session:
        # The run of the slot at anchor failed at anchor + 70 s (after the next slot was due,
        # before its fire was processed) and planned retry 1; the retry is due.
        session.execute(
            update(Schedule)
            .where(Schedule.name == "retried")
            .values(updated_at=anchor, last_slot_at=anchor, current_retry=1, retry_at=retry_at)
        )
    assert firing.fire(app, "retried", nominal_at=retry_at, trigger=Trigger.RETRY)["status"] == "in_progress"
    # The late regular fires record nothing more.
    for minutes in (1, 2):
        late = firing.fire(app, "retried", nominal_at=anchor + timedelta(minutes=minutes), trigger=Trigger.INTERVAL)
        assert late["execution_id"] is None, late
    records = sorted(
        (s.nominal_at, s.outcome, s.detail)
        for s in slots(app)
        if s.schedule_name == "retried" and s.trigger is not Trigger.RETRY
    )
    assert [(at, outcome) for at, outcome, _ in records] == [
        (anchor + timedelta(minutes=1), SlotOutcome.RETRY),
        (anchor + timedelta(minutes=2), SlotOutcome.RETRY),
    ], records
    assert all(detail and "retry 1" in detail for _, _, detail in records), records


def test_one_corrupt_schedule_does_not_stop_the_repair_of_the_others(app: ChordbeatCelery) -> None:
    for name in ("aaa-corrupt", "good"):
        service.apply_schedule(app, {"name": name, "every": 60, "steps": [step("s")]})
    with transaction(app.settings.database_url) as session:
        # Written by hand (or by an older version): no longer a valid expression.
        session.execute(update(Schedule).where(Schedule.name == "aaa-corrupt").values(cron="61 * * * *", every_s=None))
    client = get_redis(app.settings.redbeat_url)
    for name in ("aaa-corrupt", "good"):
        client.delete(ScheduleEntry.generate_key(app, entry_name(name)))
    changes = beat_entries.reconcile(app)
    assert changes.written == ["good"]
    assert client.exists(ScheduleEntry.generate_key(app, entry_name("good")))


@pytest.mark.slow
def test_what_beat_sends_keeps_no_result_in_redis(
    app: ChordbeatCelery, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    """Fires, recoveries and reconciles answer nobody: a result key for each would live a day."""
    with processes.worker(settings, tmp_path), processes.beat(settings, tmp_path):
        call(client, "chordbeat.apply_schedule", definition={"name": "quiet", "every": 1, "steps": [step("s")]})
        wait_for(lambda: len(service.list_executions(app, "quiet")) >= 3, 30, interval=0.2, what="three fires")
        redis_client = get_redis(settings.broker_url)
        results = [json.loads(redis_client.get(key) or "{}") for key in redis_client.scan_iter("celery-task-meta-*")]
    kept = [r["result"] for r in results if isinstance(r.get("result"), dict)]
    assert not [r for r in kept if "execution_id" in r or "requeued" in r], kept


def test_beat_loads_only_the_entries_due_and_the_next_one(app: ChordbeatCelery) -> None:
    """Entries due later in the current second are not reloaded on every tick until then.

    RedBeat scores whole seconds: with thousands of entries staggered over a minute, beat spent most
    of its CPU loading entries not yet due. Scored and selected by the exact due time, a tick loads
    what is due and only the next entry (to know how long to sleep).
    """
    scheduler = ChordbeatScheduler(app=app, lazy=True)
    offsets_ms = (500, 700, 900)
    for _attempt in range(5):
        second = wait_for(lambda: (now := time.time()) % 1 < 0.2 and math.floor(now), 5, 0.005, "a second's start")
        base = datetime.fromtimestamp(float(second), UTC)  # type: ignore[arg-type]
        dues = [base + timedelta(milliseconds=offset_ms) for offset_ms in offsets_ms]
        names = []
        for due in dues:
            cadence = Cadence(cron=None, every_s=60, timezone="UTC", anchor=due)
            entry = ScheduleEntry(
                name=entry_name(f"due-{due.microsecond}"),
                task=beat_entries.FIRE_TASK,
                schedule=CadenceSchedule(cadence),
                kwargs={"name": f"due-{due.microsecond}"},
                last_run_at=due - timedelta(seconds=60),
                app=app,
            ).save(reset_last_run=True)
            assert entry.score == pytest.approx(due.timestamp(), abs=1e-3)
            names.append(entry.name)
        before_first = scheduler.schedule
        in_time = time.time() < dues[0].timestamp()
        first_at = dues[0].timestamp()
        wait_for(lambda: time.time() >= first_at, 5, 0.005, "the first entry due")  # noqa: B023 (used at once)
        first_due = scheduler.schedule
        # Too slow (a busy machine) to select between the due times: try again.
        if in_time and time.time() < dues[1].timestamp():
            assert set(before_first) == {names[0]}
            assert set(first_due) == {names[0], names[1]}
            return
        get_redis(app.settings.redbeat_url).delete(app.redbeat_conf.schedule_key)
    pytest.fail("never selected the entries between their due times")


def minutely_entry(app: ChordbeatCelery, name: str, due: datetime) -> ScheduleEntry:
    """An entry of schedule ``name`` (not in the database) firing every minute, next at ``due``."""
    cadence = Cadence(cron=None, every_s=60, timezone="UTC", anchor=due)
    return ScheduleEntry(
        name=entry_name(name),
        task=beat_entries.FIRE_TASK,
        schedule=CadenceSchedule(cadence),
        kwargs={"name": name},
        last_run_at=due - timedelta(seconds=60),
        app=app,
    ).save(reset_last_run=True)


def test_a_tick_sleeps_until_the_next_entry_even_when_the_one_it_loaded_fell_due_meanwhile(
    app: ChordbeatCelery,
) -> None:
    """A tick loads the entries due and the next one, to know how long to sleep. When that next
    one fell due while the tick worked (thousands of fires to send), RedBeat sent it and then
    slept max_interval: every later entry was 5 s late (10,000 staggered schedules: all of them)."""
    scheduler = ChordbeatScheduler(app=app, lazy=True)
    scheduler.lock_key = None  # one beat; and the entries below are not in the database to repair from
    now = datetime.now(UTC)
    entry = functools.partial(minutely_entry, app)
    entry("due", now - timedelta(seconds=1))
    # Due, but scored as if it fell due just after the tick selected: it is loaded as the next
    # entry and sent by the same tick.
    meanwhile = entry("meanwhile", now - timedelta(milliseconds=500))
    client = get_redis(app.settings.redbeat_url)
    client.zadd(app.redbeat_conf.schedule_key, {meanwhile.key: now.timestamp() + 1})
    later = entry("later", now + timedelta(seconds=3))
    interval = scheduler.tick()
    sent = [[fire["name"] for fire in fires] for fires, _ in fire_messages(app)]
    assert sent == [["due", "meanwhile"]], "the due entry and the one that fell due meanwhile are sent"
    assert interval <= later.score - time.time() + 0.1, f"slept {interval:.2f} s; the next entry is due sooner"
    assert interval > 0


def test_a_standby_beat_stays_healthy_while_it_waits_for_the_lock(
    app: ChordbeatCelery, settings: Settings, tmp_path: Path
) -> None:
    """Deploy files run two beats with ``chordbeat health beat`` as liveness probe: a standby that
    never wrote its liveness file was restarted by the probe, over and over."""
    standby_settings = dataclasses.replace(settings, health_dir=str(tmp_path / "standby-health"))
    (tmp_path / "standby-health").mkdir()

    def probe() -> int:
        env = processes.settings_env(standby_settings)
        return subprocess.run([CHORDBEAT, "health", "beat"], env=env, capture_output=True).returncode

    def written_at() -> float:
        age = age_s(standby_settings, "beat")
        return -math.inf if age is None else time.time() - age

    with processes.beat(settings, tmp_path, "holder") as holder:
        wait_for(lambda: "acquired lock" in holder.output(), 30, what="the first beat to take the lock")
        with processes.beat(standby_settings, tmp_path, "standby") as standby:
            wait_for(lambda: "standing by" in standby.output(), 30, what="the second beat to stand by")
            wait_for(lambda: probe() == 0, 30, interval=0.5, what="the standby's liveness probe to pass")
            first = written_at()
            wait_for(lambda: written_at() > first, 20, interval=0.5, what="the standby's liveness file written again")
            assert "acquired lock" not in standby.output()
            # The Health page names the holder, not the standby: the lock's token says who took it.
            lock = beat_lock_line(app)
            assert lock.state == "up" and f" pid {holder.pid};" in lock.said, (lock, holder.pid)


def test_a_tick_sends_the_slots_due_together_a_hundred_a_message(app: ChordbeatCelery) -> None:
    """10,000 schedules due at once took 42 s to start: a message per slot cost beat three round
    trips each (load, reserve, publish) and the workers a transaction each."""
    scheduler = ChordbeatScheduler(app=app, lazy=True)
    scheduler.lock_key = None  # one beat; and the entries below are not in the database to repair from
    due = datetime.now(UTC) - timedelta(seconds=1)
    names = [f"due-{i:03d}" for i in range(150)]
    for name in names:
        minutely_entry(app, name, due)
    # Not written by chordbeat (no schedule named): left out, or the whole message would be refused.
    stray = minutely_entry(app, "stray", due)
    stray.kwargs = {}
    stray.save()
    scheduler.tick()
    messages = fire_messages(app)
    assert sorted(len(fires) for fires, _ in messages) == [50, 100]
    sent = [fire for fires, _ in messages for fire in fires]
    assert sorted(fire["name"] for fire in sent) == names, "each due schedule once"
    assert {fire["nominal_at"] for fire in sent} == {due.isoformat()}
    assert {fire["trigger"] for fire in sent} == {"interval"}
    expected = (due + timedelta(seconds=60) + FIRE_EXPIRY_GRACE).isoformat()
    assert [expires for _, expires in messages] == [expected, expected]
    # Every entry moved on: the next tick sends nothing more.
    client = get_redis(app.settings.redbeat_url)
    assert client.zrangebyscore(app.redbeat_conf.schedule_key, 0, time.time()) == []
    scheduler.tick()
    assert len(fire_messages(app)) == 2
