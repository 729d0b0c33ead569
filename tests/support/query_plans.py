"""Statements explained on PostgreSQL: what an engine sends, and whether its plan scans a large
table or reads more rows than a page of answers needs (tests/test_query_plans.py and
tests/test_limit_query_plans.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sqlalchemy import text

#: A sequential scan of a table this big is a defect on a path that runs all day.
LARGE_ROWS = 5_000
#: Rows one statement may read (kept, or read and filtered out) on such a table: a page of answers and
#: a housekeeping batch need far fewer.
ROW_BUDGET = 10_000
#: Tables read whole by design: the metrics scrape reads every counter row.
READ_WHOLE = {"metric_counts"}


class Statements:
    """What the app's engine sends, with parameters, from every thread of this process."""

    def __init__(self) -> None:
        self.seen: dict[str, tuple[str, Any]] = {}

    def record(self, _conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, many: bool) -> None:
        words = statement.split(None, 1)
        if not words or words[0].upper() not in {"SELECT", "UPDATE", "DELETE", "WITH"}:
            return
        if many:
            parameters = parameters[0] if parameters else None
        self.seen.setdefault(statement, (statement, parameters))


def large_tables(conn: Any) -> set[str]:
    rows = conn.execute(
        text("SELECT relname, reltuples FROM pg_class WHERE relkind = 'r' AND relnamespace = 'public'::regnamespace")
    )
    return {name for name, tuples in rows if tuples > LARGE_ROWS} - READ_WHOLE


def _scans(plan: dict[str, Any], large: set[str]) -> Iterator[tuple[str, str, int]]:
    """(node type, table, rows read) of each scan of a large table in the plan."""
    table = plan.get("Relation Name")
    if table in large:
        read = plan.get("Actual Rows", 0) * plan.get("Actual Loops", 1)
        read += plan.get("Rows Removed by Filter", 0) + plan.get("Rows Removed by Index Recheck", 0)
        yield plan["Node Type"], table, read
    for child in plan.get("Plans", ()):
        yield from _scans(child, large)


def plan_waste(plan: dict[str, Any], large: set[str]) -> str | None:
    scans = list(_scans(plan, large))
    sequential = sorted({table for kind, table, _ in scans if kind == "Seq Scan"})
    if sequential:
        return f"seq scan of {', '.join(sequential)}"
    read = sum(rows for _, _, rows in scans)
    if read > ROW_BUDGET:
        return f"read {read:,} rows of {', '.join(sorted({table for _, table, _ in scans}))}"
    return None
