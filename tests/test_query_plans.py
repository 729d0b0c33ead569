"""Every query on a hot or periodic path uses an index once history has grown (PostgreSQL).

A database holding a scaled-down 90 days of history (``bench.history_fill``: 400,000 slot records,
100,000 executions, 200,000 step attempts, 50 definition versions a schedule) runs the paths a
deployment runs all day: a run from trigger to its last step on a real worker, beat's fires (a
superseded one among them), recovery, beat-entry repair and re-firing, housekeeping, the service's
reads (definition versions too), the dashboard's pages and a metrics scrape. Every statement they
send is then explained with its own parameters; a sequential scan of a table that holds more than a
few thousand rows fails the test, naming the statement, and so does any scan that reads more rows
than a page of answers needs (an index walked backwards past other schedules' rows, a count of the
whole history): each statement runs under ``EXPLAIN ANALYZE`` in a transaction that is rolled back,
so the figures are what it really read.
A foreign key whose parent rows get deleted needs an index on its referencing side too, or each
delete scans the child table in a trigger that no ``EXPLAIN`` shows.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import create_engine, event, select, text

from bench.history_fill import HistoryShape, fill, schedule_name
from celeryapp.application import ChordbeatCelery
from celeryapp.domain.definition_versions import canonical_json, definition_hash, diff_definitions
from celeryapp.interfaces import service, version_service
from celeryapp.interfaces.web import audit_page, duration_trends, queries, run_list, versions_page
from celeryapp.monitoring.metrics import ExecutionCollector
from celeryapp.recovery import housekeeping, lost_slots, recovery
from celeryapp.scheduling import beat_entries
from celeryapp.states import AuditAction
from celeryapp.worker import firing
from models import Schedule, Trigger, get_engine, transaction, utcnow
from models.definitions import definition_of
from models.migrate import upgrade
from models.versions import versions_of
from tests.support.helpers import finished
from tests.support.query_plans import Statements, large_tables, plan_waste
from tests.support.servers import PostgresServer

SHAPE = HistoryShape(schedules=2_000, executions=100_000, slots=400_000, busy_schedules=20)


@pytest.fixture(scope="module")
def history_url(postgres_server: PostgresServer) -> str:
    postgres_server.create_database("history_plans")
    url = postgres_server.url("history_plans")
    upgrade(url)
    engine = create_engine(url)
    with engine.connect() as conn:
        fill(conn, SHAPE, utcnow())
        _fill_audit(conn)
    engine.dispose()
    return url


#: Audit rows over the same 90 days: 40 actors, every action, a tenth of them naming no schedule.
AUDIT_ROWS = 100_000


def _fill_audit(conn: Any) -> None:
    actions = [a.value for a in AuditAction]
    conn.execute(
        text(
            """
            INSERT INTO audit_events (at, actor, source, action, schedule_name)
            SELECT now() - make_interval(secs => (:rows - n) * 90 * 86400.0 / :rows),
                   'ops-' || (n % 40), 'cli', (CAST(:actions AS text[]))[1 + n % cardinality(CAST(:actions AS text[]))],
                   CASE WHEN n % 10 = 0 THEN NULL ELSE 'hist-' || lpad((1 + n % 2000)::text, 5, '0') END
            FROM generate_series(1, :rows) AS n
            """
        ),
        {"rows": AUDIT_ROWS, "actions": actions},
    )
    conn.execute(text("ANALYZE audit_events"))
    conn.commit()


@pytest.fixture
def database_url(history_url: str) -> str:
    return history_url


@pytest.fixture
def statements(app: ChordbeatCelery) -> Iterator[Statements]:
    seen = Statements()
    engine = get_engine(app.settings.database_url)
    event.listen(engine, "before_cursor_execute", seen.record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", seen.record)


def _run_the_paths(app: ChordbeatCelery, client: Any) -> None:
    url = app.settings.database_url
    now = utcnow()
    busy, quiet = schedule_name(1), schedule_name(SHAPE.schedules)
    # A run from trigger to its end on the worker: claims, finishes, advancement, metric counts.
    started = client.send_task("chordbeat.trigger_schedule", kwargs={"name": quiet}).get(timeout=30)
    finished(client, started["execution_id"], timeout=60)
    # Beat's fires: a due slot, then an older one arriving late (superseded).
    firing.fire(app, busy, nominal_at=now, trigger=Trigger.INTERVAL)
    firing.fire(app, busy, nominal_at=now - timedelta(minutes=5), trigger=Trigger.INTERVAL)
    firing.fire_batch(
        app,
        firing.batch_arguments(
            [{"name": schedule_name(2), "nominal_at": now.isoformat(), "trigger": "interval"}], now=now
        ),
    )
    recovery.recover(app)
    beat_entries.reconcile(app, full=True)
    lost_slots.refire_lost_slots(app)
    # One day past the retention: housekeeping deletes a day of runs and slot records.
    housekeeping.purge(app, now=now + timedelta(days=1))
    service.get_schedule(app, busy)
    service.list_executions(app, busy, None, 50)
    service.list_executions(app, None, "failed", 50)
    service.get_execution(app, started["execution_id"])
    service.list_slots(app, busy, 50)
    service.list_slots(app, quiet, 50)
    # Definition versions (every schedule has SHAPE.versions): a schedule's list, one, a diff of
    # its first and last, its runs of one version (migration 0018's index).
    version_service.list_versions(app, busy)
    version_service.list_versions(app, quiet, 10, before=SHAPE.versions // 2)
    version_service.get_version(app, quiet, 1)
    version_service.diff_versions(app, busy, 1, SHAPE.versions)
    service.list_executions(app, busy, None, 50, None, SHAPE.versions // 2)
    service.list_executions(app, quiet, None, 50, None, SHAPE.versions)
    # The global audit trail, each filter alone and a time range with a cursor (a statement is
    # explained with its first parameters: the ones that find least come first).
    day_ago, week_ago = (now - timedelta(days=1)).isoformat(), (now - timedelta(days=7)).isoformat()
    service.list_audit(app, actor="nobody-at-all")
    service.list_audit(app, action="pause")
    service.list_audit(app, action="pause", since=day_ago)
    service.list_audit(app, since=day_ago)
    service.list_audit(
        app, since=week_ago, until=(now - timedelta(days=6)).isoformat(), before_id=AUDIT_ROWS - AUDIT_ROWS * 13 // 180
    )
    service.list_audit(app, actor="ops-7", since=week_ago, until=day_ago)
    with transaction(url, read_only=True) as session:
        queries.schedule_page(session, search="", status="", page=1)
        queries.schedule_page(session, search="hist-0100", status="", page=1)
        queries.schedule_view(session, busy, now)
        queries.schedule_view(session, quiet, now)
        queries.execution_view(session, started["execution_id"], now)
        queries.health_view(session, now)
        for given in ({"actor": "nobody-at-all", "since": "24h"}, {"action": "pause", "schedule": busy}, {}):
            audit_page.audit_view(session, audit_page.checked_filter(given, "", now), given)
        # The Runs page: each filter alone, a time range, deep pages by cursor; its trends; a
        # schedule page's durations.
        deep = SHAPE.executions // 2
        for given, before in (
            ({"trigger": "manual"}, ""),
            ({"state": "failed", "since": "24h"}, ""),
            ({"schedule": busy}, ""),
            ({"since": week_ago, "until": day_ago}, ""),
            ({}, ""),
            ({}, str(deep)),
            ({"state": "failed"}, str(deep)),
            ({"schedule": busy}, str(deep)),
            ({"trigger": "interval"}, str(deep)),
        ):
            run_list.runs_view(session, run_list.checked_run_filter(given, before, now), given)
        duration_trends.trends_view(session, now)
        # The trends as the Runs page's filters narrow them (the state does not apply).
        for given in (
            {"schedule": busy},
            {"trigger": "manual"},
            {"since": "24h"},
            {"since": week_ago, "until": day_ago},
        ):
            duration_trends.trends_view(session, now, run_list.checked_run_filter(given, "", now))
        duration_trends.schedule_durations(session, 1)
        versions_page.runs_by_version(session, quiet)
    list(ExecutionCollector(app).collect())


def test_paths_that_run_all_day_scan_no_large_table(
    app: ChordbeatCelery, worker: Any, client: Any, statements: Statements
) -> None:
    _run_the_paths(app, client)
    assert len(statements.seen) > 20, "the paths sent too few statements to be worth checking"
    offenders: list[str] = []
    engine = create_engine(app.settings.database_url)
    with engine.connect() as conn:
        large = large_tables(conn)
        conn.rollback()
        assert {"schedule_slots", "schedule_executions", "activities", "audit_events"} <= large
        for statement, parameters in statements.seen.values():
            rolled_back = conn.begin()
            plan = conn.exec_driver_sql(f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", parameters).scalar_one()
            rolled_back.rollback()
            plan = plan if isinstance(plan, list) else json.loads(plan)
            waste = plan_waste(plan[0]["Plan"], large)
            if waste:
                offenders.append(f"{waste}: {' '.join(statement.split())[:300]}")
    engine.dispose()
    assert not offenders, "scans of large tables that read too much:\n" + "\n".join(offenders)


def test_every_foreign_key_has_an_index_on_its_referencing_columns(database_url: str) -> None:
    engine = create_engine(database_url)
    with engine.connect() as conn:
        unindexed = (
            conn.execute(
                text(
                    """
                SELECT c.conname FROM pg_constraint c
                WHERE c.contype = 'f' AND NOT EXISTS (
                    SELECT 1 FROM pg_index i
                    WHERE i.indrelid = c.conrelid
                      AND (i.indkey::int2[])[0:cardinality(c.conkey) - 1] = c.conkey
                )
                ORDER BY 1
                """
                )
            )
            .scalars()
            .all()
        )
    engine.dispose()
    assert not unindexed, f"deleting a parent row scans the child table for: {unindexed}"


def test_the_generated_versions_are_what_changes_store(database_url: str) -> None:
    # The plans above are only worth what the history is: its versions must be real ones.
    with transaction(database_url, read_only=True) as session:
        for name in (schedule_name(1), schedule_name(SHAPE.schedules)):
            schedule = session.scalars(select(Schedule).where(Schedule.name == name)).one()
            rows = versions_of(session, schedule.id, limit=SHAPE.versions + 1)
            assert [row.version for row in rows] == list(range(SHAPE.versions, 0, -1))
            assert all(row.hash == definition_hash(row.definition) for row in rows)
            # The schedule's rows read back as its last version: what an apply stores.
            assert rows[0].definition == canonical_json(definition_of(schedule).to_json())
            differences = diff_definitions(json.loads(rows[-1].definition), json.loads(rows[0].definition))
            assert {d.path for d in differences} >= {"retry_delay"}
