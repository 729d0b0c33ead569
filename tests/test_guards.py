"""Overlap, cancellation and the compare-and-set guards against duplicate messages."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery
from sqlalchemy import func, select

from celeryapp.application import ChordbeatCelery
from celeryapp.domain.names import PREFIX
from models import Activity, SlotOutcome, SlotRecord, WorkerTask, WorkerTaskStatus, transaction
from tests.support.helpers import call, execution, finished, running, step, wait_for

pytestmark = pytest.mark.both_databases


def slow(name: str, seconds: float = 30) -> dict[str, Any]:
    return step(name, kwargs={"seconds": seconds})


def worker_task(app: ChordbeatCelery, execution_id: int, step_name: str) -> WorkerTask:
    with transaction(app.settings.database_url) as session:
        task = session.scalar(
            select(WorkerTask).where(WorkerTask.execution_id == execution_id, WorkerTask.step_name == step_name)
        )
        assert task is not None
        return task


def activity_count(app: ChordbeatCelery, execution_id: int) -> int:
    with transaction(app.settings.database_url) as session:
        return session.scalar(select(func.count()).where(Activity.execution_id == execution_id)) or 0


def test_overlapping_trigger_is_skipped_and_recorded(app: ChordbeatCelery, worker: Any, client: Celery) -> None:
    call(client, "chordbeat.apply_schedule", definition={"name": "long", "every": 60, "steps": [slow("wait", 1)]})
    first = call(client, "chordbeat.trigger_schedule", name="long")
    second = call(client, "chordbeat.trigger_schedule", name="long")
    assert second == {"execution_id": None, "skipped": f"overlap: execution {first['execution_id']} is in progress"}
    with transaction(app.settings.database_url) as session:
        outcomes = [r.outcome for r in session.scalars(select(SlotRecord).order_by(SlotRecord.id))]
    assert outcomes == [SlotOutcome.FIRED, SlotOutcome.SKIPPED_OVERLAP]
    assert finished(client, first["execution_id"])["status"] == "completed"
    # Once the first run ended, a new one may start.
    assert call(client, "chordbeat.trigger_schedule", name="long")["status"] == "in_progress"


def test_allow_overlap_runs_concurrently(app: ChordbeatCelery, worker: Any, client: Celery) -> None:
    call(
        client,
        "chordbeat.apply_schedule",
        definition={"name": "many", "every": 60, "overlap": "allow", "steps": [slow("wait", 0.3)]},
    )
    ids = [call(client, "chordbeat.trigger_schedule", name="many")["execution_id"] for _ in range(2)]
    assert None not in ids and ids[0] != ids[1]
    assert [finished(client, i)["status"] for i in ids] == ["completed", "completed"]


def test_cancel_mid_step_stops_the_step_and_nothing_runs_afterwards(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    call(
        client,
        "chordbeat.apply_schedule",
        definition={"name": "cancel-me", "every": 60, "steps": [slow("long"), step("after")]},
    )
    started = call(client, "chordbeat.trigger_schedule", name="cancel-me")
    execution_id = started["execution_id"]
    running(client, execution_id, "long")

    cancelled = call(client, "chordbeat.cancel_execution", execution_id=execution_id)
    assert cancelled["status"] == "cancelled"
    assert cancelled["tasks"] == []
    assert [(a["step"], a["status"]) for a in cancelled["activities"]] == [("long", "cancelled")]

    # The 30 s step is interrupted: its runner ends (heartbeat key removed) well before.
    from celeryapp.messaging.redis_client import get_redis

    redis = get_redis(app.settings.broker_url)
    wait_for(lambda: not redis.keys(f"{PREFIX}:hb:*"), 10, what="the cancelled step to stop")
    # Cancelling again is a no-op that returns the same execution.
    assert call(client, "chordbeat.cancel_execution", execution_id=execution_id)["status"] == "cancelled"
    assert activity_count(app, execution_id) == 1
    after = execution(client, execution_id)
    assert after["activities"][0]["status"] == "cancelled" and after["current_step_index"] == 0


def test_duplicate_callbacks_and_redelivered_step_messages_change_nothing(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    call(
        client,
        "chordbeat.apply_schedule",
        definition={"name": "dupes", "every": 60, "steps": [step("first"), slow("second", 1.5), step("third")]},
    )
    execution_id = call(client, "chordbeat.trigger_schedule", name="dupes")["execution_id"]
    running(client, execution_id, "second")
    second = worker_task(app, execution_id, "second")
    assert second.status is WorkerTaskStatus.PROCESSING

    # The group-0 callback delivered again, twice, while group 1 runs: no second advancement.
    app.send_task("chordbeat.advance_execution", args=(execution_id, 0)).get(timeout=10)
    app.send_task("chordbeat.advance_execution", args=(execution_id, 0)).get(timeout=10)
    # Group 1's callback arriving early (its step still runs): it waits.
    app.send_task("chordbeat.advance_execution", args=(execution_id, 1)).get(timeout=10)
    # The running step's message redelivered, and the finished step's too: both skipped.
    assert app.send_task("chordbeat.run_step", args=(second.id, 1), ignore_result=False).get(timeout=10) == {
        "status": "skipped"
    }
    now = execution(client, execution_id)
    assert now["current_step_index"] == 1
    assert [a["step"] for a in now["activities"]] == ["first", "second"]

    done = finished(client, execution_id)
    assert done["status"] == "completed"
    assert [(a["step"], a["attempt"]) for a in done["activities"]] == [("first", 1), ("second", 1), ("third", 1)]
    # After the end, late duplicates of every kind are still no-ops.
    for index in range(3):
        app.send_task("chordbeat.advance_execution", args=(execution_id, index)).get(timeout=10)
    assert app.send_task("chordbeat.run_step", args=(second.id, 1), ignore_result=False).get(timeout=10) == {
        "status": "skipped"
    }
    assert execution(client, execution_id) == done
    schedule = call(client, "chordbeat.get_schedule", name="dupes")
    assert schedule["run_count"] == 1


def test_buffer_one_keeps_one_run_for_when_the_active_one_ends(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    call(
        client,
        "chordbeat.apply_schedule",
        definition={"name": "buf", "every": 60, "overlap": "buffer_one", "steps": [slow("wait", 0.5)]},
    )
    first = call(client, "chordbeat.trigger_schedule", name="buf")["execution_id"]
    for _ in range(2):
        skipped = call(client, "chordbeat.trigger_schedule", name="buf")
        assert skipped == {"execution_id": None, "skipped": f"buffered: execution {first} is in progress"}
    assert finished(client, first)["status"] == "completed"
    runs = wait_for(
        lambda: [e for e in call(client, "chordbeat.list_executions") if e["id"] != first], 10, what="the buffered run"
    )
    assert isinstance(runs, list) and len(runs) == 1
    assert finished(client, runs[0]["id"])["status"] == "completed"
    assert len(call(client, "chordbeat.list_executions")) == 2


def test_cancel_previous_cancels_the_active_run_and_starts(app: ChordbeatCelery, worker: Any, client: Celery) -> None:
    call(
        client,
        "chordbeat.apply_schedule",
        definition={"name": "fresh", "every": 60, "overlap": "cancel_previous", "steps": [slow("wait", 30)]},
    )
    first = call(client, "chordbeat.trigger_schedule", name="fresh")["execution_id"]
    running(client, first, "wait")
    second = call(client, "chordbeat.trigger_schedule", name="fresh")["execution_id"]
    assert second is not None and second != first
    old = execution(client, first)
    assert old["status"] == "cancelled" and old["error"] == "cancelled: a new run started"
    running(client, second, "wait")
    call(client, "chordbeat.cancel_execution", execution_id=second)


def test_two_starts_racing_make_one_execution(app: ChordbeatCelery) -> None:
    """Two transactions start the same exclusive schedule at once: the database lets one win."""
    import threading
    import time

    from celeryapp.domain.validation import parse_definition
    from celeryapp.execution.run_rows import StartResult
    from celeryapp.execution.runs import start_execution
    from celeryapp.scheduling.store import upsert_schedule
    from models import Schedule, ScheduleSource, Trigger, utcnow
    from models.audit import BEAT
    from models.versions import VersionOrigin

    url = app.settings.database_url
    with transaction(url) as session:
        definition = parse_definition({"name": "race", "every": 60, "steps": [step("a")]})
        upsert_schedule(session, definition, source=ScheduleSource.API, now=utcnow(), origin=VersionOrigin.of(BEAT))
    results: dict[str, StartResult] = {}
    first_inserted = threading.Event()

    def start(label: str, run_key: str) -> None:
        with transaction(url) as session:
            schedule = session.scalar(select(Schedule))
            assert schedule is not None
            results[label] = start_execution(session, schedule, trigger=Trigger.MANUAL, run_key=run_key, now=utcnow())
            if label == "first":
                first_inserted.set()
                # Hold the transaction open so the second one collides with it, not with its result.
                time.sleep(0.5)

    def second() -> None:
        first_inserted.wait(10)
        start("second", "race:b")

    threads = [threading.Thread(target=start, args=("first", "race:a")), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results["first"].execution_id is not None and results["first"].skipped is None
    assert results["second"].execution_id is None and results["second"].skipped is not None
    assert results["second"].skipped.startswith("overlap")
    with transaction(url) as session:
        assert session.scalar(select(func.count()).select_from(SlotRecord)) == 2


def test_a_fire_reading_the_active_run_while_it_ends_still_runs_the_buffered_slot(
    app: ChordbeatCelery, database_url: str
) -> None:
    """PostgreSQL, read committed: the fire must not buffer behind a run whose end is committing."""
    import threading

    from sqlalchemy import text

    from celeryapp.domain.validation import parse_definition
    from celeryapp.execution.runs import cancel_execution, start_execution
    from celeryapp.scheduling.store import upsert_schedule
    from celeryapp.worker import firing
    from models import ExecutionStatus, Schedule, ScheduleExecution, ScheduleSource, Trigger, utcnow
    from models.audit import BEAT
    from models.versions import VersionOrigin

    if not database_url.startswith("postgresql"):
        pytest.skip("SQLite runs one writing transaction at a time: nothing to interleave")
    url = app.settings.database_url
    with transaction(url) as session:
        definition = parse_definition(
            {"name": "buf-race", "every": 60, "overlap": "buffer_one", "steps": [slow("wait")]}
        )
        schedule, _ = upsert_schedule(
            session, definition, source=ScheduleSource.API, now=utcnow(), origin=VersionOrigin.of(BEAT)
        )
        active = start_execution(session, schedule, trigger=Trigger.MANUAL, run_key="buf-race:a", now=utcnow())
        # The anchor of the interval is a slot, the latest one for a minute.
        slot = schedule.updated_at
    assert active.execution_id is not None
    ended, release = threading.Event(), threading.Event()
    fired: dict[str, Any] = {}

    def end_the_active_run() -> None:
        with transaction(url) as session:
            cancel_execution(session, active.execution_id or 0, now=utcnow())
            ended.set()
            release.wait(30)  # the end stays uncommitted until the fire has read what it could

    def fire_a_slot() -> None:
        fired["result"] = firing.fire(app, "buf-race", nominal_at=slot, trigger=Trigger.INTERVAL)

    def fire_waits_for_a_lock() -> bool:
        with transaction(url, read_only=True) as session:
            waiting = session.scalar(
                text(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND datname = current_database()"
                )
            )
        return bool(waiting)

    ending = threading.Thread(target=end_the_active_run)
    ending.start()
    assert ended.wait(20)
    firing_thread = threading.Thread(target=fire_a_slot)
    firing_thread.start()
    # The fire reads the active run now: it either finishes (it saw the run as still active) or
    # waits for the ending transaction's lock. Only then does the end commit.
    wait_for(lambda: not firing_thread.is_alive() or fire_waits_for_a_lock(), 20, what="the fire to read")
    release.set()
    ending.join(30)
    firing_thread.join(30)
    assert fired["result"].get("status") == "in_progress", fired["result"]
    with transaction(url) as session:
        stored = session.scalar(select(Schedule))
        assert stored is not None and stored.buffered is False
        running_now = session.scalars(
            select(ScheduleExecution.id).where(ScheduleExecution.status == ExecutionStatus.IN_PROGRESS)
        ).all()
    assert running_now == [fired["result"]["execution_id"]]


def test_overlapping_failures_of_allow_runs_schedule_one_retry(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    call(
        client,
        "chordbeat.apply_schedule",
        definition={
            "name": "many-fail",
            "every": 3600,
            "overlap": "allow",
            "max_retries": 2,
            "steps": [slow("wait", 0.5), step("boom", "chordbeat.examples.fail")],
        },
    )
    ids = [call(client, "chordbeat.trigger_schedule", name="many-fail")["execution_id"] for _ in range(3)]
    assert [finished(client, i)["status"] for i in ids] == ["failed"] * 3
    schedule = call(client, "chordbeat.get_schedule", name="many-fail")
    # One retry for the three: the runs failed before it was planned, so they do not count again.
    assert (schedule["status"], schedule["current_retry"], schedule["error_count"]) == ("active", 1, 3)
    assert schedule["next_run_at"] is not None
