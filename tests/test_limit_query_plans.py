"""The shared limits' statements use their indexes when a limit is busy (PostgreSQL): 10,000 keys
held, 20,000 waiters. Every statement that taking, giving back and settling slots sends, and the
service's reads, is explained with its own parameters, as tests/test_query_plans.py does for the
rest of the hot paths."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import create_engine, event, text

from celeryapp.execution.limit_slots import Demand, Holder, acquire_or_wait, release, settle
from celeryapp.execution.limit_store import limit_detail
from models import get_engine, transaction
from tests.support.query_plans import Statements, large_tables, plan_waste

KEYS = 10_000
WAITERS_PER_KEY = 2
OTHERS = ("erp", "crm", "billing", "ledger")
#: Read whole by design: ``waiting`` counts every waiter of the limit, an index range as long as the
#: queue (20,000 entries here, a few milliseconds). A counter kept on the limit row is the way out
#: if queues grow far longer (docs/limits.md).
COUNTS_EVERY_WAITER = "SELECT count(*) AS count_1 FROM limit_waiters WHERE limit_waiters.limit_id = "


def _fill(url: str) -> int:
    """Five limits of 10,000 keys each held, waiters on each; the warehouse (returned) is the busiest."""
    engine = create_engine(url)
    with engine.begin() as conn:
        ids = [_fill_limit(conn, name, number) for number, name in enumerate(["warehouse", *OTHERS])]
        conn.execute(text("ANALYZE limits, limit_holds, limit_waiters"))
    engine.dispose()
    return ids[0]


def _fill_limit(conn: Any, name: str, number: int) -> int:
    definition = {"name": name, "slots": KEYS, "rate": None, "key": "{payload.customer}", "per_key_slots": 1}
    limit_id = conn.execute(
        text(
            "INSERT INTO limits (name, definition, slots, per_key_slots, in_use, version, created_at, updated_at)"
            " VALUES (:name, CAST(:definition AS JSON), :keys, 1, :keys, 1, now(), now()) RETURNING id"
        ),
        {"name": name, "keys": KEYS, "definition": json.dumps({**definition, "on_full": "queue", "max_wait": None})},
    ).scalar_one()
    # Worker task ids apart per limit: (number + 1) * 100,000 upwards.
    base = (number + 1) * 100_000
    conn.execute(
        text(
            "INSERT INTO limit_holds (limit_id, worker_task_id, attempt, execution_id, step_name, key, slots,"
            " since) SELECT :limit_id, :base + n, 1, :base + n, 'load', 'k' || n, 1, now()"
            " FROM generate_series(1, :keys) AS n"
        ),
        {"limit_id": limit_id, "keys": KEYS, "base": base},
    )
    waiters = KEYS * (WAITERS_PER_KEY if number == 0 else 1)
    conn.execute(
        text(
            "INSERT INTO limit_waiters (limit_id, worker_task_id, attempt, execution_id, step_name, key, slots,"
            " needs, queue, turn, enqueued_at)"
            " SELECT :limit_id, :base + :keys + n, 1, :base + :keys + n, 'load', 'k' || (n % :keys + 1), 1, 1,"
            " md5(:name || 'k' || (n % :keys + 1))::varchar(40), n / :keys, now()"
            " FROM generate_series(0, :waiters - 1) AS n"
        ),
        {"limit_id": limit_id, "keys": KEYS, "base": base, "waiters": waiters, "name": name},
    )
    return int(limit_id)


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_taking_giving_back_and_reading_slots_of_a_busy_limit_read_through_indexes(database_url: str) -> None:
    limit_id = _fill(database_url)
    seen = Statements()
    engine = get_engine(database_url)
    event.listen(engine, "before_cursor_execute", seen.record)
    try:
        with transaction(database_url) as session:
            assert not acquire_or_wait(session, [Demand("warehouse", "k17")], Holder(999_999, 1, 999_999, "late"))[0]
        with transaction(database_url) as session:
            released = release(session, 100_017, 1)
        assert released.slots == 1 and len(released.admitted.started) == 1
        with transaction(database_url) as session:
            settle(session, [limit_id])
        with transaction(database_url, read_only=True) as session:
            detail = limit_detail(session, "warehouse")
        assert len(detail["waiters"]) == 100 and len(detail["keys"]) == 1000
    finally:
        event.remove(engine, "before_cursor_execute", seen.record)
    assert len(seen.seen) > 10
    offenders: list[str] = []
    explain = create_engine(database_url)
    with explain.connect() as conn:
        large = large_tables(conn)
        conn.rollback()
        assert {"limit_holds", "limit_waiters"} <= large
        for statement, parameters in seen.seen.values():
            rolled_back = conn.begin()
            plan: Any = conn.exec_driver_sql(f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", parameters).scalar_one()
            rolled_back.rollback()
            plan = plan if isinstance(plan, list) else json.loads(plan)
            waste = plan_waste(plan[0]["Plan"], large)
            if waste and not " ".join(statement.split()).startswith(COUNTS_EVERY_WAITER):
                offenders.append(f"{waste}: {' '.join(statement.split())[:300]}")
    explain.dispose()
    assert not offenders, "scans of large tables that read too much:\n" + "\n".join(offenders)
