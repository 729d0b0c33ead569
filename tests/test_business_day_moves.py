"""``calendar.on_excluded: next_business_day`` with a real worker, on SQLite and PostgreSQL: the
fire of a slot on an excluded day records it ``moved`` ("moved to ...") and makes a one-slot
backfill that waits; nothing runs before the slot's wall time on the next business day; from then
recovery's pass starts the run with the schedule's trigger, the excluded slot as its slot (which
its step is told) and the run key ``<name>:moved:<slot>``, so a doubled fire makes one run. A slot
that cannot move (no business day within the search) is skipped saying why; an ``every``
schedule is refused the rule."""

from __future__ import annotations

import html
import json
import sys
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from sqlalchemy import select, update

from celeryapp import app as chordbeat_app
from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.context import current_step
from celeryapp.domain.times import iso
from celeryapp.errors import DefinitionError
from celeryapp.execution.runs import cancel_execution
from celeryapp.interfaces import service
from celeryapp.messaging.redis_client import get_redis
from celeryapp.recovery.recovery import RecoveryReport, top_up_backfills
from celeryapp.worker import firing
from models import Backfill, BackfillOrigin, BackfillStatus, Schedule, ScheduleExecution, Trigger, transaction
from tests.support import processes
from tests.support.helpers import call, finished
from tests.support.terminals import in_pty, plain_lines
from tests.support.web_server import VIEWER, WebServer, text_of

pytestmark = pytest.mark.both_databases

LONDON = ZoneInfo("Europe/London")
CHORDBEAT = str(Path(sys.executable).with_name("chordbeat"))
INLINE = "excluded by the schedule's calendar.exclude"
SEEN = "tests:moved:seen"


@chordbeat_app.task(name="tests.moved_records_slot")
def records_slot() -> dict[str, Any]:
    """Records the slot its step was told."""
    context = current_step()
    assert context is not None
    seen = {"execution_id": context.execution_id, "slot": context.slot.isoformat() if context.slot else None}
    get_redis(chordbeat_app.settings.broker_url).rpush(SEEN, json.dumps(seen))
    return {"ok": True}


def latest_slot() -> datetime:
    """The newest 18:00 London slot that is due now."""
    now = datetime.now(LONDON)
    slot = datetime.combine(now.date(), time(18), LONDON)
    return (slot if slot <= now else slot - timedelta(days=1)).astimezone(UTC)


def business_day_18(after: date, excluded: set[date]) -> datetime:
    """18:00 London on the first weekday after ``after`` that is not excluded."""
    day = after + timedelta(days=1)
    while day.weekday() >= 5 or day in excluded:
        day += timedelta(days=1)
    return datetime.combine(day, time(18), LONDON).astimezone(UTC)


def definition(excluded: list[date], on_excluded: str = "next_business_day") -> dict[str, Any]:
    return {
        "name": "payroll",
        "cron": "0 18 * * *",
        "timezone": "Europe/London",
        "steps": [{"name": "pay", "task": "tests.moved_records_slot"}],
        "calendar": {"exclude": [day.isoformat() for day in excluded], "on_excluded": on_excluded},
    }


def slot_records(client: Celery) -> list[tuple[str, str, str, str | None]]:
    rows = call(client, "chordbeat.list_slots", name="payroll", limit=100)
    return sorted((r["nominal_at"], r["trigger"], r["outcome"], r["detail"]) for r in rows)


def runs(app: ChordbeatCelery) -> list[ScheduleExecution]:
    with transaction(app.settings.database_url) as session:
        query = select(ScheduleExecution).where(ScheduleExecution.schedule_name == "payroll")
        return list(session.scalars(query.order_by(ScheduleExecution.id)))


def backfills(app: ChordbeatCelery) -> list[Backfill]:
    with transaction(app.settings.database_url) as session:
        return list(session.scalars(select(Backfill).order_by(Backfill.id)))


def top_up(app: ChordbeatCelery, now: datetime) -> None:
    top_up_backfills(app, now, RecoveryReport())


def test_an_excluded_slot_moves_to_the_next_business_day_and_runs_there_once(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    slot = latest_slot()
    day = slot.astimezone(LONDON).date()
    call(client, "chordbeat.apply_schedule", definition=definition([day]))
    target = business_day_18(day, {day})
    moved = f"moved to {iso(target)}: {INLINE}"
    assert firing.fire(app, "payroll", nominal_at=slot, trigger=Trigger.CRON) == {
        "execution_id": None,
        "skipped": moved,
    }
    # A doubled fire of the slot (two beats, a redelivery) is a duplicate: one backfill.
    assert firing.fire(app, "payroll", nominal_at=slot, trigger=Trigger.CRON)["skipped"] == "duplicate"
    assert slot_records(client) == [(iso(slot), "cron", "moved", moved)]
    (waiting,) = backfills(app)
    assert (waiting.origin, waiting.not_before, waiting.started, waiting.status) == (
        BackfillOrigin.MOVED,
        target,
        0,
        BackfillStatus.RUNNING,
    )
    assert [datetime.fromisoformat(s) for s in waiting.slots] == [slot]
    # Before its time nothing starts: recovery's pass now, and a second before it.
    top_up(app, datetime.now(UTC))
    top_up(app, target - timedelta(seconds=1))
    assert runs(app) == []
    # At its time the pass starts it: the regular trigger, the excluded slot, its own run key.
    top_up(app, target)
    (run,) = runs(app)
    assert (run.trigger, run.slot, run.backfill_id, run.run_key) == (
        Trigger.CRON,
        slot,
        waiting.id,
        f"payroll:moved:{iso(slot)}",
    )
    assert finished(client, run.id)["status"] == "completed"
    seen = [json.loads(item) for item in get_redis(app.settings.broker_url).lrange(SEEN, 0, -1)]
    assert seen == [{"execution_id": run.id, "slot": slot.isoformat()}]
    assert slot_records(client) == sorted(
        [(iso(slot), "cron", "moved", moved), (iso(slot), "cron", "fired", f"moved from {iso(slot)}: {INLINE}")]
    )
    # The run ended by the real clock, before its time in this test: the next pass marks the
    # backfill completed, starting nothing more.
    top_up(app, target)
    assert [b.status for b in backfills(app)] == [BackfillStatus.COMPLETED]
    assert len(runs(app)) == 1
    # The slot fired again as if no fire had processed it: moved again, but its run key has run.
    with transaction(app.settings.database_url) as session:
        session.execute(update(Schedule).values(last_slot_at=None))
    assert firing.fire(app, "payroll", nominal_at=slot, trigger=Trigger.CRON)["skipped"] == moved
    top_up(app, target)
    assert len(runs(app)) == 1
    # A moved run is no regular run of the schedule's counters.
    schedule = call(client, "chordbeat.get_schedule", name="payroll")
    assert (schedule["status"], schedule["run_count"]) == ("active", 0)


def test_a_slot_that_cannot_move_is_skipped_saying_why(app: ChordbeatCelery) -> None:
    slot = latest_slot()
    day = slot.astimezone(LONDON).date()
    # 400 days in a row excluded: no business day within the search's 366.
    service.apply_schedule(app, definition([day + timedelta(days=n) for n in range(400)]))
    answer = firing.fire(app, "payroll", nominal_at=slot, trigger=Trigger.CRON)
    why = f"not run: {INLINE}; not moved: no business day within 366 days after {day.isoformat()}"
    assert answer == {"execution_id": None, "skipped": why}
    assert backfills(app) == [] and runs(app) == []
    with transaction(app.settings.database_url) as session:
        assert session.scalar(select(Schedule.last_slot_at)) == slot


def test_skip_stays_the_default_and_every_schedules_are_refused_the_move(app: ChordbeatCelery) -> None:
    slot = latest_slot()
    day = slot.astimezone(LONDON).date()
    service.apply_schedule(app, definition([day], on_excluded="skip"))
    assert firing.fire(app, "payroll", nominal_at=slot, trigger=Trigger.CRON)["skipped"] == f"not run: {INLINE}"
    assert backfills(app) == []
    interval = {**definition([day]), "every": 3600}
    del interval["cron"]
    with pytest.raises(DefinitionError) as caught:
        service.apply_schedule(app, interval)
    assert {e.field for e in caught.value.errors} == {"calendar.on_excluded"}


def test_the_preview_says_where_an_excluded_slot_moves(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings
) -> None:
    first = latest_slot() + timedelta(days=1)
    days = [(first + timedelta(days=n)).astimezone(LONDON).date() for n in range(8)]
    # The third coming slot's day excluded, and the weekday after it: its run moves past both.
    excluded = {days[2], next(day for day in days[3:] if day.weekday() < 5)}
    call(client, "chordbeat.apply_schedule", definition=definition(sorted(excluded)))
    expected = [
        f"{INLINE}; moved to {business_day_18(day, excluded).astimezone(LONDON):%a %Y-%m-%d} 18:00"
        if day in excluded
        else None
        for day in days
    ]
    fires = call(client, "chordbeat.next_fires", name="payroll", count=8)
    assert [datetime.fromisoformat(f["local"]).date() for f in fires] == days
    assert [f["excluded"] for f in fires] == expected
    # As a person sees it: chordbeat next in a terminal 80 columns wide.
    status, output = in_pty([CHORDBEAT, "next", "payroll", "-n", "8"], processes.settings_env(settings), columns=80)
    assert status == 0, output
    text = " ".join(" ".join(plain_lines(output)).split())
    for reason in filter(None, expected):
        assert f"not run: {reason}" in text, output
    assert all(len(line) <= 80 for line in plain_lines(output)), output
    # The schedule page's coming fire times say it too.
    with WebServer(app) as web:
        page = html.unescape(text_of(web.session(VIEWER).get(web.url + "/schedule?name=payroll", timeout=10).text))
    for reason in filter(None, expected):
        assert f"not run: {reason}" in page, page


def test_an_exclusive_schedule_runs_the_day_s_own_slot_first_then_the_moved_one(app: ChordbeatCelery) -> None:
    slot = latest_slot()
    day = slot.astimezone(LONDON).date()
    service.apply_schedule(app, definition([day]))  # overlap skip: exclusive
    target = business_day_18(day, {day})
    firing.fire(app, "payroll", nominal_at=slot, trigger=Trigger.CRON)
    # The day moved to has its own slot at that time: it fires and runs.
    assert firing.fire(app, "payroll", nominal_at=target, trigger=Trigger.CRON)["status"] == "in_progress"
    (regular,) = runs(app)
    # The moved run is due, but a regular run is in progress: it waits, and is not skipped.
    top_up(app, target)
    assert len(runs(app)) == 1
    with transaction(app.settings.database_url) as session:
        cancel_execution(session, regular.id, now=target + timedelta(minutes=1), reason="ended by the test")
    first, moved = runs(app)
    assert [(r.trigger, r.slot, r.run_key) for r in (first, moved)] == [
        (Trigger.CRON, target, f"payroll:cron:{iso(target)}"),
        (Trigger.CRON, slot, f"payroll:moved:{iso(slot)}"),
    ]
