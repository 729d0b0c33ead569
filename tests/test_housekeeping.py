"""Housekeeping: one pass at a time across the deployment, in turns that give the thread back."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import func, select, update

from celeryapp.application import ChordbeatCelery
from celeryapp.messaging.redis_client import get_redis
from celeryapp.recovery import housekeeping
from models import Activity, ScheduleExecution, SlotRecord, transaction, utcnow
from tests.support.helpers import call, finished, step, wait_for

pytestmark = pytest.mark.both_databases


def _old_runs(app: ChordbeatCelery, client: Celery, count: int) -> list[int]:
    """``count`` finished runs (with their slot records) made older than the retention."""
    call(client, "chordbeat.apply_schedule", definition={"name": "old", "every": 3600, "steps": [step("a")]})
    ids = []
    for _ in range(count):
        ids.append(call(client, "chordbeat.trigger_schedule", name="old")["execution_id"])
        finished(client, ids[-1])
    long_ago = utcnow() - timedelta(days=app.settings.retention_days + 1)
    with transaction(app.settings.database_url) as session:
        session.execute(update(ScheduleExecution).values(completed_at=long_ago))
        session.execute(update(SlotRecord).values(recorded_at=long_ago))
    return ids


def _count(app: ChordbeatCelery, table: Any) -> int:
    with transaction(app.settings.database_url, read_only=True) as session:
        return int(session.scalar(select(func.count()).select_from(table)) or 0)


def test_a_pass_does_nothing_while_another_host_runs_one(app: ChordbeatCelery, worker: Any, client: Celery) -> None:
    _old_runs(app, client, 2)
    other_host = get_redis(app.settings.broker_url).lock(housekeeping.LEASE_KEY, timeout=60, blocking=False)
    assert other_host.acquire()

    report = housekeeping.purge(app)
    assert report.skipped and (report.executions, report.slots) == (0, 0)
    assert _count(app, ScheduleExecution) == 2

    other_host.release()
    report = housekeeping.purge(app)
    assert not report.skipped and not report.unfinished
    assert (report.executions, report.slots) == (2, 2)
    assert _count(app, ScheduleExecution) == _count(app, Activity) == _count(app, SlotRecord) == 0
    assert not get_redis(app.settings.broker_url).exists(housekeeping.LEASE_KEY), "the lease outlived its pass"


def test_a_pass_over_its_budget_leaves_the_rest_to_follow_up_passes(
    app: ChordbeatCelery, worker: Any, client: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    _old_runs(app, client, 3)
    # A budget spent by the first batch, of one run: each pass deletes one run and sends the next.
    monkeypatch.setattr(housekeeping, "PASS_BUDGET_S", 0.0)
    monkeypatch.setattr(housekeeping, "EXECUTION_BATCH", 1)
    monkeypatch.setattr(housekeeping, "FOLLOW_UP_DELAY_S", 0.1)

    first = client.send_task("chordbeat.housekeeping").get(timeout=30)
    assert first["executions"] == 1 and first["unfinished"], first
    wait_for(lambda: _count(app, ScheduleExecution) == 0, 30, what="follow-up passes to delete the other runs")
    wait_for(lambda: _count(app, SlotRecord) == 0, 30, what="follow-up passes to delete the slot records")
    assert _count(app, Activity) == 0
