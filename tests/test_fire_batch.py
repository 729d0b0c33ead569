"""Fires a beat tick sends together: each slot ends as it would alone, in far fewer statements."""

from __future__ import annotations

import json
import re
import threading
from base64 import b64decode
from datetime import datetime, timedelta
from typing import Any

import pytest
import redis
from sqlalchemy import select, update

from celeryapp.application import ChordbeatCelery
from celeryapp.domain.names import STEPS_QUEUE
from celeryapp.interfaces import service
from celeryapp.messaging import keys
from celeryapp.messaging.redis_client import get_redis
from celeryapp.worker import firing
from celeryapp.worker.firing import Fire
from models import (
    ExecutionStatus,
    MetricCount,
    Schedule,
    ScheduleExecution,
    SlotRecord,
    Trigger,
    WorkerTask,
    transaction,
    utcnow,
)
from tests.support.helpers import recorded_statements, step
from tests.support.servers import wait_for

HOUR = timedelta(hours=1)


def _scenario(app: ChordbeatCelery, prefix: str, anchor: datetime) -> list[Fire]:
    """Hourly schedules named ``prefix`` + what happens to their fire, all anchored at ``anchor``
    (five hours ago: the slot at ``anchor + 5 h`` is due, the next one is not)."""

    def apply(name: str, **fields: Any) -> None:
        steps = [step("a"), [step("b"), step("c")]]
        service.apply_schedule(app, {"name": prefix + name, "every": 3600, "steps": steps, **fields})

    for name in ("starts", "starts-too", "paused", "missed", "superseded", "twice"):
        apply(name, overlap="allow")
    apply("exclusive", overlap="skip")
    apply("busy", overlap="skip")
    apply("buffers", overlap="buffer_one")
    apply("cancels", overlap="cancel_previous")
    service.pause_schedule(app, prefix + "paused")
    service.trigger_schedule(app, prefix + "busy")
    service.trigger_schedule(app, prefix + "buffers")
    service.trigger_schedule(app, prefix + "cancels")
    with transaction(app.settings.database_url) as session:
        session.execute(update(Schedule).where(Schedule.name.startswith(prefix)).values(updated_at=anchor))
        # Its fires of the slots after this one never arrived.
        session.execute(update(Schedule).where(Schedule.name == prefix + "missed").values(last_slot_at=anchor + HOUR))
    due = anchor + 5 * HOUR
    fires = [
        Fire(prefix + name, due, Trigger.INTERVAL)
        for name in ("starts", "exclusive", "paused", "busy", "buffers", "cancels", "missed", "gone", "starts-too")
    ]
    fires.append(Fire(prefix + "superseded", due - HOUR, Trigger.INTERVAL))
    fires += [Fire(prefix + "twice", due, Trigger.INTERVAL)] * 2
    return fires


def _normal(text: Any, prefix: str) -> Any:
    """Ids, manual run keys and the scenario's prefix out of the way: both scenarios compare equal."""
    if not isinstance(text, str):
        return text
    text = re.sub(r"manual:[0-9a-f]{32}", "manual:X", text.replace(prefix, ""))
    return re.sub(r"(execution|run) \d+", r"\1 N", text)


def _state(app: ChordbeatCelery, prefix: str) -> dict[str, list[tuple[Any, ...]]]:
    """What the fires of the scenario named ``prefix`` left behind."""

    def rows(statement: Any) -> list[tuple[Any, ...]]:
        return sorted((tuple(_normal(value, prefix) for value in row) for row in session.execute(statement)), key=repr)

    mine = Schedule.name.startswith(prefix)
    with transaction(app.settings.database_url, read_only=True) as session:
        execution = ScheduleExecution
        return {
            "executions": rows(
                select(
                    execution.schedule_name,
                    execution.trigger,
                    execution.run_key,
                    execution.status,
                    execution.error,
                    execution.plan,
                    execution.exclusive_key.is_not(None),
                    execution.deadline_at.is_not(None),
                ).where(execution.schedule_name.startswith(prefix))
            ),
            "tasks": rows(
                select(execution.schedule_name, execution.run_key, WorkerTask.step_name, WorkerTask.status)
                .join(execution, execution.id == WorkerTask.execution_id)
                .where(execution.schedule_name.startswith(prefix))
            ),
            "slots": rows(
                select(
                    SlotRecord.schedule_name,
                    SlotRecord.nominal_at,
                    SlotRecord.outcome,
                    SlotRecord.trigger,
                    SlotRecord.detail,
                    SlotRecord.execution_id.is_not(None),
                ).where(SlotRecord.schedule_name.startswith(prefix))
            ),
            "schedules": rows(
                select(
                    Schedule.name,
                    Schedule.status,
                    Schedule.last_slot_at,
                    Schedule.next_run_at,
                    Schedule.last_run_at.is_not(None),
                    Schedule.buffered,
                    Schedule.run_count,
                ).where(mine)
            ),
            "counts": rows(
                select(MetricCount.metric, MetricCount.schedule_name, MetricCount.label, MetricCount.count).where(
                    MetricCount.schedule_name.startswith(prefix)
                )
            ),
        }


def _answers(answers: list[dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
    return [
        {
            key: "N" if key == "execution_id" and value is not None else _normal(value, prefix)
            for key, value in a.items()
        }
        for a in answers
    ]


def test_each_slot_of_a_batch_ends_as_it_would_alone(app: ChordbeatCelery) -> None:
    """Starts, a skip for overlap, a buffered run, a cancelled run, a pause, missed slots, a
    superseded slot, a schedule that is gone and a slot sent twice, in one batch."""
    anchor = utcnow().replace(microsecond=0) - 5 * HOUR
    alone = _scenario(app, "alone-", anchor)
    together = _scenario(app, "together-", anchor)
    answers_alone = [firing.fire(app, f.name, nominal_at=f.nominal_at, trigger=f.trigger) for f in alone]
    answers_together = firing.fire_batch(app, together)
    assert _answers(answers_together, "together-") == _answers(answers_alone, "alone-")
    started = [a for a in answers_together if a.get("status") == "in_progress"]
    assert len(started) == 6, answers_together  # starts, starts-too, exclusive, cancels, missed, twice (once)
    assert _state(app, "together-") == _state(app, "alone-")


def _statements_of(app: ChordbeatCelery, call: Any) -> list[str]:
    with recorded_statements(app, skip=("BEGIN", "SAVEPOINT", "RELEASE")) as statements:
        call()
    return statements


def test_a_batch_of_fires_that_start_runs_costs_the_statements_of_one(app: ChordbeatCelery) -> None:
    """A fire alone costs 8-9 statements; 50 together cost 9 (10,000 due at once: 90,000 -> 1,800)."""
    anchor = utcnow().replace(microsecond=0) - 5 * HOUR
    names = [f"s{i:02d}" for i in range(50)]
    for i, name in enumerate(names):
        overlap = "skip" if i % 2 else "allow"
        service.apply_schedule(app, {"name": name, "every": 3600, "overlap": overlap, "steps": [step("a"), step("b")]})
    with transaction(app.settings.database_url) as session:
        session.execute(update(Schedule).values(updated_at=anchor))
    fires = [Fire(name, anchor + 5 * HOUR, Trigger.INTERVAL) for name in names]
    answers: list[dict[str, Any]] = []
    statements = _statements_of(app, lambda: answers.extend(firing.fire_batch(app, fires)))
    assert [a["status"] for a in answers] == ["in_progress"] * 50
    # Lock and read the rows, look for active runs of the exclusive ones, claim the slots, the
    # schedules with their steps, the executions, their worker tasks, the schedules' last run,
    # the slot records and their counters.
    assert statements == ["SELECT", "SELECT", "UPDATE", "SELECT", "INSERT", "INSERT", "UPDATE", "INSERT", "INSERT"]
    # The same slots again: each a duplicate, none a second run.
    again = firing.fire_batch(app, fires)
    assert again == [{"execution_id": None, "skipped": "duplicate"}] * 50
    with transaction(app.settings.database_url) as session:
        assert len(session.scalars(select(ScheduleExecution.id)).all()) == 50


def test_a_slot_that_fails_alone_does_not_stop_the_others(app: ChordbeatCelery, monkeypatch: Any) -> None:
    anchor = utcnow().replace(microsecond=0) - 5 * HOUR
    for name in ("ok", "broken", "paused"):
        service.apply_schedule(app, {"name": name, "every": 3600, "steps": [step("a")]})
    service.pause_schedule(app, "broken")
    service.pause_schedule(app, "paused")
    with transaction(app.settings.database_url) as session:
        session.execute(update(Schedule).values(updated_at=anchor))
    fires = [Fire(name, anchor + 5 * HOUR, Trigger.INTERVAL) for name in ("broken", "ok", "paused")]
    # Paused schedules' slots are fired alone; the first fails as a broken connection would.
    original = firing.fire

    def failing(app_: ChordbeatCelery, name: str, **kwargs: Any) -> dict[str, Any]:
        if name == "broken":
            raise ConnectionError("the database went away")
        return original(app_, name, **kwargs)

    monkeypatch.setattr(firing, "fire", failing)
    with pytest.raises(ConnectionError):
        firing.fire_batch(app, fires)
    assert [e["schedule"] for e in service.list_executions(app, "ok")] == ["ok"]
    with transaction(app.settings.database_url, read_only=True) as session:
        recorded = session.execute(select(SlotRecord.schedule_name, SlotRecord.outcome)).all()
    assert sorted((name, outcome.value) for name, outcome in recorded) == [
        ("ok", "fired"),
        ("paused", "skipped_paused"),
    ]


def test_a_batch_of_the_largest_schedules_writes_their_worker_tasks_in_statements_of_bounded_size(
    app: ChordbeatCelery,
) -> None:
    """100 fires of schedules of 500 steps are 50,000 worker tasks: one INSERT would need 300,000
    parameters (SQLite allows 32,766, PostgreSQL 65,535)."""
    anchor = utcnow().replace(microsecond=0) - 5 * HOUR
    groups = [[step(f"s{g}-{i}") for i in range(5)] for g in range(100)]  # the most steps a schedule has
    names = ["big-1", "big-2", "big-3", "big-4", "big-5"]
    for name in names:
        service.apply_schedule(app, {"name": name, "every": 3600, "steps": groups})
    with transaction(app.settings.database_url) as session:
        session.execute(update(Schedule).values(updated_at=anchor))
    answers: list[dict[str, Any]] = []
    fires = [Fire(name, anchor + 5 * HOUR, Trigger.INTERVAL) for name in names]
    statements = _statements_of(app, lambda: answers.extend(firing.fire_batch(app, fires)))
    assert [a["status"] for a in answers] == ["in_progress"] * 5
    # Executions, slots, counts; 2,500 worker tasks in statements of at most 1,000 rows.
    assert statements.count("INSERT") == 3 + 3
    with transaction(app.settings.database_url) as session:
        assert len(session.scalars(select(WorkerTask.id)).all()) == 2500


def test_a_batchs_first_groups_cost_the_same_redis_round_trips_whatever_their_number(
    app: ChordbeatCelery, monkeypatch: Any
) -> None:
    """Each run's chord size, message and marker had a round trip (four a run, with the marker's
    script): 100,000 due at once spent most of the worker's time waiting for Redis."""
    anchor = utcnow().replace(microsecond=0) - 5 * HOUR
    names = [f"r{i:02d}" for i in range(45)]
    for i, name in enumerate(names):
        first = [step("a"), step("b")] if i % 3 == 0 else step("a")  # a chord of one and of two
        service.apply_schedule(app, {"name": name, "every": 3600, "steps": [first, step("c")]})
    with transaction(app.settings.database_url) as session:
        session.execute(update(Schedule).values(updated_at=anchor))
    sent: list[int] = []
    send = redis.connection.AbstractConnection.send_packed_command

    me = threading.get_ident()

    def counted(connection: Any, *args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() == me:  # not the reference clock's reading in the background
            sent.append(1)  # one write of commands to a Redis server, then their replies: a round trip
        return send(connection, *args, **kwargs)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counted)
    round_trips = []
    for batch in (names[:2], names[2:7], names[7:]):  # the first connects and loads scripts
        sent.clear()
        answers = firing.fire_batch(app, [Fire(name, anchor + 5 * HOUR, Trigger.INTERVAL) for name in batch])
        assert [a["status"] for a in answers] == ["in_progress"] * len(batch)
        round_trips.append(len(sent))
    monkeypatch.undo()
    assert round_trips[1] == round_trips[2] <= 4, round_trips  # 5 runs, then 38
    # Each step as a chord part of its own group, which the result backend counts as
    # set_chord_size would (its size, kept as long), each attempt marked as sent.
    client, backend = get_redis(app.settings.broker_url), app.backend
    backend.set_chord_size("reference", 1)
    kept = backend.client.ttl(backend.get_key_for_group("reference", ".s"))
    queues = [key for key in client.keys(f"{STEPS_QUEUE}*") if client.type(key) == "list"]
    messages = [json.loads(raw) for key in queues for raw in client.lrange(key, 0, -1)]
    groups: dict[str, list[int]] = {}
    for message in messages:
        headers = message["headers"]
        groups.setdefault(headers["group"], []).append(headers["group_index"])
        body = json.loads(b64decode(message["body"]))[2]["chord"]
        assert (body["task"], body["options"]["group_id"]) == ("chordbeat.advance_execution", headers["group"])
    assert sorted(len(parts) for parts in groups.values()) == [1] * 30 + [2] * 15
    for group_id, parts in groups.items():
        assert sorted(parts) == list(range(len(parts)))
        size = backend.get_key_for_group(group_id, ".s")
        assert int(backend.client.get(size)) == len(parts)
        assert kept - 1 <= backend.client.ttl(size) <= kept
    with transaction(app.settings.database_url, read_only=True) as session:
        first = select(WorkerTask.id, ScheduleExecution.token).join(ScheduleExecution)
        attempts = session.execute(first.where(WorkerTask.step_index == 0)).all()
    assert len(attempts) == 60 == len(messages)
    assert all(client.exists(keys.dispatch_marker_key(task_id, 1, token)) for task_id, token in attempts)
    assert int(client.hget(keys.HIGH_WATER_KEY, keys.WORKER_TASKS_MARK)) == max(task_id for task_id, _ in attempts)


def test_the_first_groups_a_batch_sends_together_run_and_their_chords_advance_the_runs(
    app: ChordbeatCelery, worker: Any
) -> None:
    anchor = utcnow().replace(microsecond=0) - 5 * HOUR
    names = [f"w{i}" for i in range(4)]
    for name in names:
        service.apply_schedule(app, {"name": name, "every": 3600, "steps": [[step("a"), step("b")], step("c")]})
    with transaction(app.settings.database_url) as session:
        session.execute(update(Schedule).values(updated_at=anchor))
    answers = firing.fire_batch(app, [Fire(name, anchor + 5 * HOUR, Trigger.INTERVAL) for name in names])
    started = [answer["execution_id"] for answer in answers]

    def statuses() -> list[ExecutionStatus]:
        with transaction(app.settings.database_url, read_only=True) as session:
            return list(session.scalars(select(ScheduleExecution.status).where(ScheduleExecution.id.in_(started))))

    # Each chord's body advanced its run to the second group, whose end ended the run.
    wait_for(lambda: statuses() == [ExecutionStatus.COMPLETED] * 4, 30, interval=0.1, what="the four runs complete")
