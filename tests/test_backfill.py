"""Backfills with a real worker, called as other services call them: a dry run lists the slots, a
real one runs them oldest first at most ``max_concurrent`` at a time with each step told its
slot, the same request twice starts nothing the second time, a cancel stops what has not
started, and an exclusive schedule's regular slots keep running while a long backfill runs."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import func, select, update

from celeryapp import app as chordbeat_app
from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.context import current_step
from celeryapp.interfaces.backfill_service import get_backfill
from celeryapp.messaging.redis_client import get_redis
from celeryapp.recovery.recovery import recover
from celeryapp.worker import firing
from models import ExecutionStatus, Schedule, ScheduleExecution, Trigger, transaction, utcnow
from tests.support import processes
from tests.support.fault_tasks import read_log
from tests.support.helpers import call, wait_for

pytestmark = pytest.mark.both_databases

HOUR = timedelta(hours=1)
SEEN = "tests:backfill:seen"


@chordbeat_app.task(name="tests.backfill_records_slot")
def records_slot(seconds: float = 0.0) -> dict[str, Any]:
    """Records the run and the slot its step was told, then takes ``seconds``."""
    context = current_step()
    assert context is not None
    seen = {"execution_id": context.execution_id, "slot": context.slot.isoformat() if context.slot else None}
    get_redis(chordbeat_app.settings.broker_url).rpush(SEEN, json.dumps(seen))
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)
    return {"ok": True}


def _definition(name: str, seconds: float, **fields: Any) -> dict[str, Any]:
    steps = [{"name": "s", "task": "tests.backfill_records_slot", "kwargs": {"seconds": seconds}}]
    return {"name": name, "cron": "0 * * * *", "steps": steps, **fields}


def _hours_ago(hours: int) -> datetime:
    return datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - hours * HOUR


def _z(when: datetime) -> str:
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _backfill_runs(app: ChordbeatCelery, name: str) -> list[ScheduleExecution]:
    with transaction(app.settings.database_url) as session:
        query = select(ScheduleExecution).where(
            ScheduleExecution.schedule_name == name, ScheduleExecution.trigger == Trigger.BACKFILL
        )
        return list(session.scalars(query.order_by(ScheduleExecution.id)))


def _completed(client: Celery, backfill_id: int) -> bool:
    return bool(call(client, "chordbeat.get_backfill", backfill_id=backfill_id)["status"] == "completed")


def _in_progress(app: ChordbeatCelery, name: str) -> int:
    with transaction(app.settings.database_url) as session:
        return (
            session.scalar(
                select(func.count()).where(
                    ScheduleExecution.schedule_name == name, ScheduleExecution.status == ExecutionStatus.IN_PROGRESS
                )
            )
            or 0
        )


def test_a_backfill_runs_its_slots_oldest_first_at_most_max_concurrent_each_told_its_slot(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    call(client, "chordbeat.apply_schedule", definition=_definition("hourly", 0.4, overlap="allow"))
    start, end = _hours_ago(7), _hours_ago(1)
    wanted = [_z(start + HOUR * k) for k in range(6)]
    request = {"name": "hourly", "start": _z(start), "end": _z(end), "max_concurrent": 2}
    dry = call(client, "chordbeat.backfill_schedule", dry_run=True, **request)
    assert dry == {"backfill_id": None, "slots": wanted, "count": 6, "none_because": None}
    assert _backfill_runs(app, "hourly") == []  # a dry run starts nothing
    answer = call(client, "chordbeat.backfill_schedule", actor="ops", reason="outage", **request)
    assert answer["slots"] == wanted and answer["backfill_id"] is not None
    backfill_id = answer["backfill_id"]
    # The same request while it runs: the same backfill, nothing more started.
    assert call(client, "chordbeat.backfill_schedule", **request) == answer
    most = 0

    def done() -> bool:
        nonlocal most
        most = max(most, _in_progress(app, "hourly"))
        return bool(call(client, "chordbeat.get_backfill", backfill_id=backfill_id)["status"] == "completed")

    wait_for(done, 60, what="the backfill to complete")
    assert 1 <= most <= 2
    runs = _backfill_runs(app, "hourly")
    assert [_z(run.slot) for run in runs if run.slot] == wanted  # oldest first, one run per slot
    assert {run.status for run in runs} == {ExecutionStatus.COMPLETED}
    seen = [json.loads(item) for item in get_redis(app.settings.broker_url).lrange(SEEN, 0, -1)]
    told = {item["execution_id"]: item["slot"] for item in seen}
    assert {run.id: run.slot.isoformat() if run.slot else None for run in runs} == told
    first = call(client, "chordbeat.get_execution", execution_id=runs[0].id)
    assert (first["trigger"], first["slot"]) == ("backfill", wanted[0])
    view = call(client, "chordbeat.get_backfill", backfill_id=backfill_id)
    progress = {k: view[k] for k in ("total", "started", "running", "completed", "failed", "cancelled", "skipped")}
    assert progress == {
        "total": 6,
        "started": 6,
        "running": 0,
        "completed": 6,
        "failed": 0,
        "cancelled": 0,
        "skipped": 0,
    }
    assert (view["actor"], view["reason"], view["mode"], view["origin"]) == ("ops", "outage", "missing", "request")
    assert call(client, "chordbeat.list_backfills", name="hourly") == [view]
    # Asked again once done: every slot has its run now, nothing starts.
    again = call(client, "chordbeat.backfill_schedule", **request)
    assert (again["backfill_id"], again["slots"], again["count"]) == (None, [], 0)
    assert again["none_because"].startswith("the 6 slots from ") and "already have a run" in again["none_because"]
    # Mode all runs every slot again (mode missing ran them under their regular keys); the same
    # request made again once that is done starts nothing: each slot's backfill key made its run.
    for runs_then, skipped in ((12, 0), (12, 6)):
        again = call(client, "chordbeat.backfill_schedule", mode="all", **request)["backfill_id"]
        wait_for(partial(_completed, client, again), 30, what="the mode-all backfill to complete")
        assert len(_backfill_runs(app, "hourly")) == runs_then
        assert call(client, "chordbeat.get_backfill", backfill_id=again)["skipped"] == skipped


def test_cancel_stops_the_slots_not_started(app: ChordbeatCelery, worker: Any, client: Celery) -> None:
    call(client, "chordbeat.apply_schedule", definition=_definition("slow", 1.0))
    request = {"name": "slow", "start": _z(_hours_ago(6)), "end": _z(_hours_ago(1))}
    backfill_id = call(client, "chordbeat.backfill_schedule", **request)["backfill_id"]
    cancelled = call(client, "chordbeat.cancel_backfill", backfill_id=backfill_id, actor="ops", reason="enough")
    assert (cancelled["status"], cancelled["total"], cancelled["started"]) == ("cancelled", 5, 1)
    wait_for(lambda: _in_progress(app, "slow") == 0, 30, what="the started run to end")
    # It ran to its end; nothing else starts, now or at recovery's next pass.
    recover(app)
    runs = _backfill_runs(app, "slow")
    assert [run.status for run in runs] == [ExecutionStatus.COMPLETED]
    view = call(client, "chordbeat.get_backfill", backfill_id=backfill_id)
    assert (view["status"], view["started"], view["completed"]) == ("cancelled", 1, 1)


def test_regular_slots_keep_running_while_a_long_backfill_runs(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    """An exclusive (``skip``) schedule: each regular slot meeting a backfill run is buffered, not
    skipped, and runs before the backfill's next slot (the fire path called as beat's message does)."""
    call(client, "chordbeat.apply_schedule", definition={**_definition("busy", 1.2), "cron": None, "every": 2})
    anchor = utcnow().replace(microsecond=0) - HOUR
    with transaction(app.settings.database_url) as session:
        session.execute(update(Schedule).where(Schedule.name == "busy").values(updated_at=anchor))
    request = {"name": "busy", "start": _z(anchor), "end": _z(anchor + timedelta(seconds=12))}
    backfill_id = call(client, "chordbeat.backfill_schedule", **request)["backfill_id"]

    def latest_slot() -> datetime:
        return anchor + timedelta(seconds=2) * ((utcnow() - anchor) // timedelta(seconds=2))

    fired: list[datetime] = []
    for number in range(1, 4):
        wait_for(
            lambda: _running(app) == [Trigger.BACKFILL] and latest_slot() not in fired,
            20,
            what="a backfill run in progress and a new slot due",
        )
        slot = latest_slot()
        answer = firing.fire(app, "busy", nominal_at=slot, trigger=Trigger.INTERVAL)
        assert answer["skipped"].startswith("buffered: backfill run"), answer
        fired.append(slot)
        wait_for(lambda n=number: _regular_runs(app) == n, 20, what="the buffered regular run to start")
    wait_for(
        lambda: call(client, "chordbeat.get_backfill", backfill_id=backfill_id)["status"] == "completed",
        60,
        what="the backfill to complete",
    )
    wait_for(lambda: _in_progress(app, "busy") == 0, 30, what="the last run to end")
    outcomes = [(s["trigger"], s["outcome"]) for s in call(client, "chordbeat.list_slots", name="busy", limit=100)]
    assert outcomes.count(("interval", "buffered")) == 3 and ("interval", "skipped_overlap") not in outcomes
    assert len(_backfill_runs(app, "busy")) == 6
    # Regular runs alternated with the backfill's: each buffered slot ran before the next backfill run.
    with transaction(app.settings.database_url) as session:
        order = list(
            session.scalars(
                select(ScheduleExecution.trigger)
                .where(ScheduleExecution.schedule_name == "busy")
                .order_by(ScheduleExecution.id)
            )
        )
    assert order[:6] == [Trigger.BACKFILL, Trigger.INTERVAL] * 3


def _running(app: ChordbeatCelery) -> list[Trigger]:
    with transaction(app.settings.database_url) as session:
        query = select(ScheduleExecution.trigger).where(
            ScheduleExecution.schedule_name == "busy", ScheduleExecution.status == ExecutionStatus.IN_PROGRESS
        )
        return list(session.scalars(query))


def _regular_runs(app: ChordbeatCelery) -> int:
    with transaction(app.settings.database_url) as session:
        return (
            session.scalar(
                select(func.count()).where(
                    ScheduleExecution.schedule_name == "busy", ScheduleExecution.trigger == Trigger.INTERVAL
                )
            )
            or 0
        )


@pytest.mark.timeout(120)
def test_a_backfill_goes_on_after_its_worker_is_killed_mid_run(
    app: ChordbeatCelery, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    """SIGKILL of the worker running a backfill's first slot: recovery runs the lost step again,
    its end starts the next slots, and every slot runs once."""
    log = tmp_path / "steps.log"
    steps = [{"name": "s", "task": "faults.tick", "kwargs": {"log": str(log), "seconds": 1.0}}]
    env = processes.FAULT_TASKS_ENV
    with processes.worker(settings, tmp_path, "w1", env=env) as w1:
        call(client, "chordbeat.apply_schedule", definition={"name": "killed", "cron": "0 * * * *", "steps": steps})
        request = {"name": "killed", "start": _z(_hours_ago(4)), "end": _z(_hours_ago(1))}
        backfill_id = call(client, "chordbeat.backfill_schedule", **request)["backfill_id"]
        wait_for(lambda: any(e["event"] == "tick" for e in read_log(str(log))), 30, what="the first step to run")
        w1.kill()
    with processes.worker(settings, tmp_path, "w2", env=env), processes.beat(settings, tmp_path):
        wait_for(
            lambda: call(client, "chordbeat.get_backfill", backfill_id=backfill_id)["status"] == "completed",
            90,
            interval=0.5,
            what="the backfill to complete after the kill",
        )
    runs = _backfill_runs(app, "killed")
    assert [_z(run.slot) for run in runs if run.slot] == [_z(_hours_ago(h)) for h in (4, 3, 2)]
    assert [run.status for run in runs] == [ExecutionStatus.COMPLETED] * 3
    # The first slot's step was lost with the worker and ran again; the others ran once.
    starts = [(e["execution_id"], e["attempt"]) for e in read_log(str(log)) if e["event"] == "start"]
    assert sorted(starts) == [(runs[0].id, 1), (runs[0].id, 2), (runs[1].id, 1), (runs[2].id, 1)]
    view = get_backfill(app, backfill_id)  # the workers are gone: read in-process
    assert (view["total"], view["completed"], view["skipped"]) == (3, 3, 0)
