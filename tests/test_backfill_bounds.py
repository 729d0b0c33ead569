"""Backfills are bounded per schedule and across the deployment: slots not started yet in running
backfills (CHORDBEAT_BACKFILL_MAX_PENDING_PER_SCHEDULE, CHORDBEAT_BACKFILL_MAX_PENDING) and the
step executions a schedule's backfills may still queue (CHORDBEAT_BACKFILL_MAX_STEP_RUNS). A
request past a bound is refused naming ``end`` with nothing written, its dry run as well; a
cancel makes room. ``list_backfills`` answers summaries without loading the slot lists.

The schedules are paused, so no run starts and every slot requested stays pending (no worker)."""

from __future__ import annotations

import dataclasses
import json
import threading
import tracemalloc
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, text, update

from celeryapp.application import ChordbeatCelery
from celeryapp.domain.times import iso
from celeryapp.errors import InvalidArgument
from celeryapp.execution.backfills import create_backfill, lock_backfill_totals
from celeryapp.interfaces import service
from celeryapp.interfaces.backfill_service import backfill_schedule, cancel_backfill, get_backfill, list_backfills
from models import Backfill, BackfillOrigin, BackfillStatus, Schedule, ScheduleStatus, transaction
from tests.support.helpers import step, wait_for

pytestmark = pytest.mark.both_databases

NOW = datetime.now(UTC).replace(second=0, microsecond=0)


def _window(index: int, minutes: int = 10) -> dict[str, str]:
    """The ``index``-th range of ``minutes`` minutely slots, ranges apart from each other."""
    start = NOW - timedelta(days=1) + timedelta(minutes=index * minutes)
    return {"start": start.isoformat(), "end": (start + timedelta(minutes=minutes)).isoformat()}


def _paused(app: ChordbeatCelery, name: str, steps: int = 1) -> None:
    definition = {"name": name, "cron": "* * * * *", "overlap": "allow", "steps": [step(f"s{i}") for i in range(steps)]}
    service.apply_schedule(app, definition)
    with transaction(app.settings.database_url) as session:
        session.execute(update(Schedule).where(Schedule.name == name).values(status=ScheduleStatus.PAUSED))


def _backfills(app: ChordbeatCelery) -> int:
    with transaction(app.settings.database_url, read_only=True) as session:
        return int(session.scalar(select(func.count()).select_from(Backfill)) or 0)


@pytest.fixture
def bounded(app: ChordbeatCelery) -> Iterator[ChordbeatCelery]:
    previous = app.settings
    app.apply_settings(
        dataclasses.replace(
            previous, backfill_max_pending_per_schedule=50, backfill_max_pending=80, backfill_max_step_runs=120
        )
    )
    yield app
    app.apply_settings(previous)


def _refused(app: ChordbeatCelery, name: str, window: dict[str, str], variable: str) -> None:
    before = _backfills(app)
    for dry in (True, False):
        with pytest.raises(InvalidArgument) as refused:
            backfill_schedule(app, name, dry_run=dry, **window)
        message = str(refused.value)
        assert message.startswith("end: ") and variable in message, message
        assert len(message) < 300
    assert _backfills(app) == before


def test_the_sixth_request_past_the_schedules_bound_is_refused(bounded: ChordbeatCelery) -> None:
    _paused(bounded, "minutely")
    for index in range(5):
        assert backfill_schedule(bounded, "minutely", **_window(index))["count"] == 10
    _refused(bounded, "minutely", _window(5), "CHORDBEAT_BACKFILL_MAX_PENDING_PER_SCHEDULE")
    # A cancel gives back the slots it stops; the same request then goes through.
    cancel_backfill(bounded, list_backfills(bounded, "minutely")[0]["id"])
    assert backfill_schedule(bounded, "minutely", **_window(5))["backfill_id"] is not None


def test_the_deployments_bound_counts_every_schedule(bounded: ChordbeatCelery) -> None:
    for name in ("first", "second"):
        _paused(bounded, name)
    for index in range(4):
        backfill_schedule(bounded, "first", **_window(index))
    backfill_schedule(bounded, "second", **_window(0, minutes=30))
    # 40 + 30 waiting: ten more reach 80, eleven pass it (each schedule stays under its 50).
    _refused(bounded, "second", _window(3, minutes=11), "more than 80 (CHORDBEAT_BACKFILL_MAX_PENDING)")
    assert backfill_schedule(bounded, "second", **_window(3, minutes=10))["count"] == 10


def test_a_request_queueing_too_many_step_executions_is_refused(bounded: ChordbeatCelery) -> None:
    _paused(bounded, "wide", steps=6)
    # 21 slots of 6 steps: 126 step executions, past 120; 20 slots are exactly 120.
    _refused(bounded, "wide", _window(0, minutes=21), "CHORDBEAT_BACKFILL_MAX_STEP_RUNS")
    assert backfill_schedule(bounded, "wide", **_window(0, minutes=20))["count"] == 20
    _refused(bounded, "wide", _window(30, minutes=1), "CHORDBEAT_BACKFILL_MAX_STEP_RUNS")


def test_the_default_bounds_refuse_the_amplification_found(app: ChordbeatCelery) -> None:
    """What 5 messages did: 10,000 slots of a 100-step schedule each (5,000,000 step executions)."""
    _paused(app, "hundred", steps=100)
    start = NOW - timedelta(minutes=10_001)
    window = {"start": start.isoformat(), "end": (start + timedelta(minutes=10_000)).isoformat()}
    _refused(app, "hundred", window, "more than 200000 (CHORDBEAT_BACKFILL_MAX_STEP_RUNS)")


def _large_backfills(app: ChordbeatCelery, count: int, slots: int) -> None:
    """``count`` running backfills of ``slots`` minutely slots each, written as a request leaves them."""
    first = NOW - timedelta(days=30)
    stored = [(first + timedelta(minutes=i)).isoformat() for i in range(slots)]
    with transaction(app.settings.database_url) as session:
        schedule_id = session.scalar(select(Schedule.id).where(Schedule.name == "minutely"))
        for index in range(count):
            session.add(
                Backfill(
                    schedule_id=schedule_id,
                    schedule_name="minutely",
                    origin=BackfillOrigin.REQUEST,
                    mode="all",
                    range_start=first,
                    range_end=first + timedelta(minutes=slots),
                    slots=stored,
                    started=index,
                    max_concurrent=1,
                    status=BackfillStatus.RUNNING,
                    created_at=NOW,
                )
            )


def test_list_backfills_answers_small_summaries_without_loading_slots(app: ChordbeatCelery) -> None:
    _paused(app, "minutely")
    _large_backfills(app, 50, 10_000)
    tracemalloc.start()
    try:
        listed = list_backfills(app, "minutely", limit=50)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(listed) == 50
    # Loading the 500,000 stored slots took 56 MB; a summary page needs a few hundred kB.
    assert peak < 5_000_000, peak
    size = len(json.dumps(listed))
    assert size < 50 * 1000, size
    for view in listed:
        assert not any(isinstance(value, list | dict) for value in view.values()), view
        assert view["total"] == 10_000 and view["started"] == 49 - (listed[0]["id"] - view["id"])
    newest: dict[str, Any] = listed[0]
    first = NOW - timedelta(days=30)
    assert newest["first_slot"] == iso(first)
    assert newest["last_slot"] == iso(first + timedelta(minutes=9_999))
    assert newest["next_slot"] == iso(first + timedelta(minutes=49))
    assert get_backfill(app, newest["id"]) == newest


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_requests_for_two_schedules_cannot_pass_the_total_together(bounded: ChordbeatCelery) -> None:
    """Each request holds only its own schedule's row lock: without a lock on the totals, one for
    ``second`` would read the deployment's pending slots before ``first``'s request committed and
    both would pass. Here ``first``'s request is a transaction of the test's, held open."""
    for name in ("first", "second"):
        _paused(bounded, name)
    outcome: list[BaseException | dict[str, Any]] = []
    with transaction(bounded.settings.database_url) as session:
        lock_backfill_totals(session)
        schedule_id = session.scalar(select(Schedule.id).where(Schedule.name == "first"))
        assert schedule_id is not None
        start = NOW - timedelta(days=2)
        create_backfill(
            session,
            schedule_id,
            [start + timedelta(minutes=i) for i in range(45)],
            origin=BackfillOrigin.REQUEST,
            max_concurrent=1,
            now=NOW,
            mode="all",
        )

        def request() -> None:
            try:
                outcome.append(backfill_schedule(bounded, "second", **_window(0, minutes=40)))
            except BaseException as exc:  # handed to the test's thread
                outcome.append(exc)

        thread = threading.Thread(target=request)
        thread.start()
        # Waiting for the totals' lock, or (without that lock) answered already.
        wait_for(lambda: outcome or _waiting_on_advisory_lock(bounded), what="the request waiting or answered")
    thread.join(timeout=30)
    assert len(outcome) == 1
    refused = outcome[0]
    assert isinstance(refused, InvalidArgument), refused
    assert "more than 80 (CHORDBEAT_BACKFILL_MAX_PENDING)" in str(refused)
    assert _backfills(bounded) == 1


def _waiting_on_advisory_lock(app: ChordbeatCelery) -> bool:
    with transaction(app.settings.database_url, read_only=True) as session:
        waiting = session.scalar(
            select(func.count()).select_from(text("pg_locks")).where(text("locktype = 'advisory' AND NOT granted"))
        )
    return bool(waiting)
