"""A backfill request is refused, naming the argument, before anything is written: reversed or
empty ranges, more than 10,000 slots (found by walking 10,001, however long the range), times
that do not exist or say no offset, huge strings, and ``max_concurrent`` of zero, NaN, a boolean
or a string. What running backfills may hold summed over requests (pending slots per schedule and
in total, step executions) is refused in test_backfill_bounds.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, update

from celeryapp.application import ChordbeatCelery
from celeryapp.errors import ChordbeatError, InvalidArgument, InvalidTransition, NotFound
from celeryapp.interfaces import service
from celeryapp.interfaces.backfill_service import backfill_schedule, cancel_backfill, get_backfill, list_backfills
from models import Backfill, Schedule, ScheduleStatus, transaction
from tests.support.helpers import step

NOW = datetime.now(UTC).replace(second=0, microsecond=0)
START, END = (NOW - timedelta(hours=6)).isoformat(), (NOW - timedelta(hours=1)).isoformat()

REFUSED: list[tuple[dict[str, Any], type[ChordbeatError], str]] = [
    ({"start": END, "end": START}, InvalidArgument, "end: "),
    ({"start": START, "end": START}, InvalidArgument, "end: "),
    ({"start": (NOW - timedelta(days=8)).isoformat()}, InvalidArgument, "end: the range holds more than 10000 slots"),
    ({"start": "1926-01-01T00:00:00+00:00"}, InvalidArgument, "end: the range holds more than 10000 slots"),
    ({"end": (NOW + timedelta(hours=1)).isoformat()}, InvalidArgument, "end: "),
    (
        {"max_concurrent": float("nan")},
        InvalidArgument,
        "max_concurrent: must be a whole number from 1 to 100, got nan",
    ),
    ({"max_concurrent": 0}, InvalidArgument, "max_concurrent: must be a whole number from 1 to 100, got 0"),
    ({"max_concurrent": -3}, InvalidArgument, "max_concurrent: "),
    ({"max_concurrent": 101}, InvalidArgument, "max_concurrent: "),
    ({"max_concurrent": 10**400}, InvalidArgument, "max_concurrent: "),
    ({"max_concurrent": True}, InvalidArgument, "max_concurrent: must be a whole number from 1 to 100, got True"),
    ({"max_concurrent": "1"}, InvalidArgument, "max_concurrent: "),
    ({"max_concurrent": 1.0}, InvalidArgument, "max_concurrent: "),
    ({"start": "2026-01-01T00:00:00"}, InvalidArgument, "start: must say its UTC offset"),
    ({"start": "2026-02-30T00:00:00Z"}, InvalidArgument, "start: is not a time that exists"),
    # Year 1 in a zone east of UTC: one microsecond earlier is year 0 (was an OverflowError).
    ({"start": "0001-01-01T00:00:00+05:30"}, InvalidArgument, "start: is out of range"),
    ({"start": "0001-01-01T00:00:00Z"}, InvalidArgument, "start: is out of range"),
    ({"end": "9999-12-31T23:59:00-05:00"}, InvalidArgument, "end: is out of range"),
    ({"end": "yesterday"}, InvalidArgument, "end: is not a time that exists"),
    ({"start": "2026-01-01T00:00:00Z" + " " * 10**6}, InvalidArgument, "start: must be an ISO 8601 time"),
    ({"start": 1767225600}, InvalidArgument, "start: must be an ISO 8601 time with its UTC offset, got int"),
    ({"name": "x" * 10**6}, InvalidArgument, "name: "),
    ({"name": "missing"}, NotFound, "schedule 'missing' does not exist"),
    ({"mode": "sometimes"}, InvalidArgument, "mode: must be one of missing, failed, all"),
    ({"mode": None}, InvalidArgument, "mode: "),
    ({"dry_run": "yes"}, InvalidArgument, "dry_run: must be true or false"),
    ({"actor": "x" * 1000}, InvalidArgument, "actor: "),
    ({"name": "exclusive", "max_concurrent": 2}, InvalidArgument, "max_concurrent: must be 1: schedule 'exclusive'"),
    ({"name": "finished"}, InvalidTransition, "schedule 'finished' is done; only an active or paused"),
]


@pytest.fixture
def schedules(app: ChordbeatCelery) -> None:
    for name, overlap in (("minutely", "allow"), ("exclusive", "skip"), ("finished", "allow")):
        definition = {"name": name, "cron": "* * * * *", "overlap": overlap, "steps": [step("s")]}
        service.apply_schedule(app, definition)
    with transaction(app.settings.database_url) as session:
        session.execute(update(Schedule).where(Schedule.name == "finished").values(status=ScheduleStatus.DONE))


@pytest.mark.parametrize(("change", "error", "message"), REFUSED)
def test_a_bad_request_is_refused_naming_the_argument(
    app: ChordbeatCelery, schedules: None, change: dict[str, Any], error: type[ChordbeatError], message: str
) -> None:
    request: dict[str, Any] = {"name": "minutely", "start": START, "end": END, **change}
    with pytest.raises(error) as refused:
        backfill_schedule(app, **request)
    assert type(refused.value) is error
    assert str(refused.value).startswith(message), str(refused.value)
    assert len(str(refused.value)) < 300
    with transaction(app.settings.database_url) as session:
        assert session.scalar(select(func.count()).select_from(Backfill)) == 0


def test_a_range_of_exactly_ten_thousand_slots_is_accepted(app: ChordbeatCelery, schedules: None) -> None:
    start = NOW - timedelta(minutes=10_001)
    answer = backfill_schedule(
        app, "minutely", start.isoformat(), (start + timedelta(minutes=10_000)).isoformat(), dry_run=True
    )
    assert answer["count"] == 10_000 and answer["backfill_id"] is None


@pytest.mark.parametrize(
    ("call", "kwargs", "error", "message"),
    [
        (cancel_backfill, {"backfill_id": True}, InvalidArgument, "backfill_id: must be an integer"),
        (cancel_backfill, {"backfill_id": "1"}, InvalidArgument, "backfill_id: must be an integer"),
        (cancel_backfill, {"backfill_id": 0}, InvalidArgument, "backfill_id: must be between 1"),
        (cancel_backfill, {"backfill_id": 10**400}, InvalidArgument, "backfill_id: must be between 1"),
        (cancel_backfill, {"backfill_id": 5}, NotFound, "backfill 5 does not exist"),
        (cancel_backfill, {"backfill_id": 5, "reason": "x" * 10**6}, InvalidArgument, "reason: "),
        (get_backfill, {"backfill_id": float("nan")}, InvalidArgument, "backfill_id: must be an integer"),
        (list_backfills, {"name": "minutely", "limit": 0}, InvalidArgument, "limit: "),
        (list_backfills, {"name": "missing"}, NotFound, "schedule 'missing' does not exist"),
    ],
)
def test_a_bad_backfill_id_is_refused_naming_it(
    app: ChordbeatCelery, schedules: None, call: Any, kwargs: dict[str, Any], error: type[ChordbeatError], message: str
) -> None:
    with pytest.raises(error) as refused:
        call(app, **kwargs)
    assert type(refused.value) is error and str(refused.value).startswith(message), str(refused.value)
