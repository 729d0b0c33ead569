"""Overload: a skipped slot costs a few statements, and sustained skipping is visible."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import event, select, update

from celeryapp.application import ChordbeatCelery
from celeryapp.domain.names import CONTROL_QUEUE
from celeryapp.interfaces import service
from celeryapp.messaging.redis_client import get_redis
from celeryapp.monitoring import overload
from celeryapp.monitoring.metrics import ExecutionCollector
from celeryapp.worker import firing
from models import Schedule, SlotOutcome, SlotRecord, Trigger, get_engine, transaction, utcnow
from tests.support.helpers import step

pytestmark = pytest.mark.both_databases


def schedules_with_active_runs(app: ChordbeatCelery, count: int) -> list[str]:
    """``count`` hourly ``skip`` schedules of three steps, each with a run in progress (no worker
    takes it), whose latest slot was ten seconds ago."""
    names = [f"busy-{i}" for i in range(count)]
    steps = [step(f"s{i}") for i in range(3)]
    for name in names:
        service.apply_schedule(app, {"name": name, "every": 3600, "steps": steps})
        assert service.trigger_schedule(app, name)["status"] == "in_progress"
    with transaction(app.settings.database_url) as session:
        session.execute(update(Schedule).values(updated_at=utcnow() - timedelta(seconds=3610)))
    return names


def test_a_skipped_slot_costs_five_statements_and_reads_no_steps(app: ChordbeatCelery) -> None:
    (name,) = schedules_with_active_runs(app, 1)
    with transaction(app.settings.database_url) as session:
        anchor = session.get_one(Schedule, 1).updated_at
    statements: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if not statement.startswith("BEGIN"):
            statements.append(statement)

    engine = get_engine(app.settings.database_url)
    event.listen(engine, "before_cursor_execute", record)
    try:
        answer = firing.fire(app, name, nominal_at=anchor + timedelta(seconds=3600), trigger=Trigger.INTERVAL)
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert str(answer["skipped"]).startswith("overlap: execution 1 is in progress"), answer
    # Lock and read the schedule's row, claim the slot, look for the active run, record the skip,
    # add it to the monotonic slot counter (chordbeat_slots_total).
    assert len(statements) == 5, statements
    assert "metric_counts" in statements[-1], statements
    assert not [s for s in statements if "schedule_steps" in s], statements
    assert outcomes(app, name) == [SlotOutcome.FIRED, SlotOutcome.SKIPPED_OVERLAP]


def outcomes(app: ChordbeatCelery, name: str) -> list[SlotOutcome]:
    with transaction(app.settings.database_url) as session:
        return list(
            session.scalars(select(SlotRecord.outcome).where(SlotRecord.schedule_name == name).order_by(SlotRecord.id))
        )


def test_sustained_skipping_is_counted_warned_about_and_exported(
    app: ChordbeatCelery, caplog: pytest.LogCaptureFixture
) -> None:
    names = schedules_with_active_runs(app, 3)
    with transaction(app.settings.database_url) as session:
        anchor = session.get_one(Schedule, 1).updated_at
    client = get_redis(app.settings.broker_url)
    # Fire messages waiting behind the ones being worked off.
    for _ in range(5):
        app.send_task("chordbeat.fire_schedule", kwargs={"name": names[0]}, queue=CONTROL_QUEUE)
    for name in names:
        answer = firing.fire(app, name, nominal_at=anchor + timedelta(seconds=3600), trigger=Trigger.INTERVAL)
        assert "overlap" in str(answer["skipped"])
    # A minute later the first skip warns once, for the whole deployment, about the minute before.
    later = utcnow().timestamp() + 60
    with caplog.at_level(logging.WARNING, logger="celeryapp.monitoring.overload"):
        overload.note_skipped(app.settings.broker_url, 1, now=later)
        overload.note_skipped(app.settings.broker_url, 1, now=later)
    # Only overload's: a step watch of an earlier test, its Redis gone, may warn in this process.
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == overload.__name__]
    assert len(warnings) == 1, warnings
    assert "3 slots were skipped in the last minute" in warnings[0]
    assert "5 fire and control messages wait in 'chordbeat.control'" in warnings[0]
    # Exported by `chordbeat metrics` (the last complete minute, and the queues' depth).
    assert overload.skipped_last_minute(client, now=later) == 3
    families = {f.name: f for f in ExecutionCollector(app).collect()}
    depth = {s.labels["queue"]: s.value for s in families["chordbeat_queued_messages"].samples}
    assert depth[CONTROL_QUEUE] == 5
    assert "chordbeat_overlap_skips_last_minute" in families
