"""Beat's periodic reconcile at scale: cost of what changed, never of the whole Redis database."""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import delete, event, insert, update

from celeryapp.application import ChordbeatCelery
from celeryapp.domain.validation import parse_definition
from celeryapp.interfaces import service
from celeryapp.messaging.redis_client import get_redis
from celeryapp.scheduling import beat_entries
from celeryapp.scheduling.beat_entries import ScheduleEntry, entry_name
from celeryapp.scheduling.store import upsert_schedule
from celeryapp.worker import firing
from models import Schedule, ScheduleSource, ScheduleStatus, Trigger, get_engine, transaction, utcnow
from models.audit import BEAT
from models.versions import VersionOrigin
from tasks.control import reconcile_beat
from tests.support.helpers import step

pytestmark = pytest.mark.both_databases

#: Past SQLite's 32,766 bound parameters in one statement.
MANY = 40_000
#: SQLite's default bound-parameter limit (some distributions build it higher).
SQLITE_DEFAULT_MAX_VARIABLES = 32_766


def sqlite_default_limits(url: str) -> None:
    """Hold this test's SQLite connections to the limit most builds have."""
    if not url.startswith("sqlite"):
        return
    engine = get_engine(url)
    engine.dispose()

    @event.listens_for(engine, "connect")
    def _limit(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, SQLITE_DEFAULT_MAX_VARIABLES)


def entry_key(app: ChordbeatCelery, name: str) -> str:
    return str(ScheduleEntry.generate_key(app, entry_name(name)))


def commands(app: ChordbeatCelery) -> dict[str, int]:
    """Redis commands run since the last reset, by name."""
    stats: dict[str, Any] = get_redis(app.settings.redbeat_url).info("commandstats")
    return {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}


def reset_commands(app: ChordbeatCelery) -> None:
    get_redis(app.settings.redbeat_url).config_resetstat()


def add_schedules(app: ChordbeatCelery, count: int) -> list[str]:
    """``count`` active ``every: 60`` schedules, defined an hour ago, written straight into the
    database (no entries)."""
    now = utcnow()
    names = [f"s-{i:05d}" for i in range(count)]
    hour_ago = now - timedelta(hours=1)
    rows = [
        {"name": n, "every_s": 60.0, "next_run_at": now + timedelta(seconds=60), "changed_at": hour_ago} for n in names
    ]
    with transaction(app.settings.database_url) as session:
        session.execute(insert(Schedule), rows)
    return names


@pytest.mark.slow
def test_reconcile_with_40000_schedules_writes_every_entry_then_costs_only_what_changed(app: ChordbeatCelery) -> None:
    sqlite_default_limits(app.settings.database_url)
    names = add_schedules(app, MANY)
    lost = names[0]
    # One schedule's fire was lost: its entry exists and beat moved past the slot the database
    # still waits for. It must be re-fired in the same pass that writes the other entries.
    beat_entries.sync_schedules(app, [lost])
    slot = utcnow().replace(microsecond=0) - timedelta(minutes=2)
    with transaction(app.settings.database_url) as session:
        session.execute(update(Schedule).where(Schedule.name == lost).values(next_run_at=slot))
    ScheduleEntry.from_key(entry_key(app, lost), app=app).reschedule(last_run_at=slot + timedelta(seconds=1))
    # Keys of other kinds in the same database (broker, results) cost reconcile nothing.
    get_redis(app.settings.redbeat_url).mset({f"celery-task-meta-{i}": "{}" for i in range(5000)})

    reset_commands(app)
    first = reconcile_beat()
    assert len(first["written"]) == MANY - 1 and first["removed"] == []
    assert first["refired"] == [lost]
    client = get_redis(app.settings.redbeat_url)
    assert client.zcard(app.redbeat_conf.schedule_key) >= MANY
    used = commands(app)
    assert "scan" not in used, used
    # Pipelined: a few hundred round trips' worth of commands, not two per schedule one at a time
    # (the command count is the same either way; what is checked is that nothing scans).

    # Nothing changed: the next pass reads no entry at all.
    reset_commands(app)
    second = reconcile_beat()
    assert second == {"written": [], "removed": [], "refired": []}
    used = commands(app)
    assert used.get("hmget", 0) == 0 and "scan" not in used and "zscan" not in used, used

    # One schedule changed in the database: only it is looked at and rewritten.
    with transaction(app.settings.database_url) as session:
        session.execute(update(Schedule).where(Schedule.name == names[-1]).values(every_s=120.0, changed_at=utcnow()))
    reset_commands(app)
    third = reconcile_beat()
    assert third["written"] == [names[-1]]
    assert commands(app).get("hmget", 0) == 1
    stored = json.loads(client.hget(entry_key(app, names[-1]), "definition") or "{}")
    assert stored["schedule"]["every"] == 120.0


def test_a_change_whose_entry_sync_was_lost_is_picked_up_by_the_periodic_reconcile(app: ChordbeatCelery) -> None:
    for name in ("kept", "edited", "paused", "gone"):
        service.apply_schedule(app, {"name": name, "every": 60, "steps": [step("s")]})
    assert beat_entries.reconcile(app, full=True).empty
    client = get_redis(app.settings.redbeat_url)
    kept_before = client.hgetall(entry_key(app, "kept"))
    # Changes committed whose entry sync never happened (Redis away, a crash after commit).
    with transaction(app.settings.database_url) as session:
        definition = parse_definition({"name": "edited", "cron": "*/5 * * * *", "steps": [step("s")]})
        upsert_schedule(session, definition, source=ScheduleSource.API, now=utcnow(), origin=VersionOrigin.of(BEAT))
        session.execute(
            update(Schedule).where(Schedule.name == "paused").values(status=ScheduleStatus.PAUSED, changed_at=utcnow())
        )
    result = reconcile_beat()
    assert result == {"written": ["edited"], "removed": ["paused"], "refired": []}
    assert json.loads(client.hget(entry_key(app, "edited"), "definition") or "{}")["schedule"]["cron"] == "*/5 * * * *"
    assert not client.exists(entry_key(app, "paused"))
    assert client.hgetall(entry_key(app, "kept")) == kept_before
    # A deleted schedule whose entry stayed: its next fire removes the entry.
    with transaction(app.settings.database_url) as session:
        session.execute(delete(Schedule).where(Schedule.name == "gone"))
    assert reconcile_beat()["removed"] == []
    answer = firing.fire(app, "gone", nominal_at=datetime.now(UTC), trigger=Trigger.INTERVAL)
    assert answer["skipped"] == "schedule does not exist"
    assert not client.exists(entry_key(app, "gone"))
    assert client.zscore(app.redbeat_conf.schedule_key, entry_key(app, "gone")) is None


def test_lost_slots_are_refired_even_when_repairing_entries_fails(app: ChordbeatCelery) -> None:
    service.apply_schedule(app, {"name": "lost", "every": 60, "steps": [step("s")]})
    slot = utcnow().replace(microsecond=0) - timedelta(minutes=2)
    with transaction(app.settings.database_url) as session:
        session.execute(update(Schedule).values(next_run_at=slot))
    ScheduleEntry.from_key(entry_key(app, "lost"), app=app).reschedule(last_run_at=slot + timedelta(seconds=1))
    # The reconcile's own bookkeeping is unreadable: the repair fails, the re-fire must not.
    client = get_redis(app.settings.redbeat_url)
    client.hset(app.redbeat_conf.key_prefix + beat_entries.WATERMARK_KEY, "x", "y")
    result = reconcile_beat()
    assert result["refired"] == ["lost"] and result["failed"] == ["reconcile"]
    # Re-fired once: a fire merely queued behind others is not doubled by every pass.
    assert reconcile_beat()["refired"] == []
