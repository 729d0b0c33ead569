"""Ninety days of history, generated in SQL on PostgreSQL (``generate_series``), in seconds.

The shape follows a deployment that keeps the default retention: every schedule has runs spread
evenly over the days kept, each run two step attempts and one ``fired`` slot record; a few busy
schedules (every minute, mostly skipped because their runs overlap) have half the runs and most
slot records, the overload case where the slot table outgrows the executions ten to one. One run in fifty failed.
Runs take 30 to 50 s, started a second after their slot; the runs of one schedule in a hundred
take a minute longer over the last tenth of the history (getting slower, for the Runs page).
Used by the benchmark's history scenario and, at a smaller scale, by the query-plan test.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection, text

#: Names of the generated schedules: ``hist-00001`` …; nothing else in a test uses the prefix.
NAME_PREFIX = "hist-"


@dataclass(frozen=True)
class HistoryShape:
    schedules: int = 10_000
    executions: int = 1_000_000
    slots: int = 13_000_000
    days: float = 90.0
    #: Schedules (the first ones) that hold the slot records beyond one per run.
    busy_schedules: int = 100
    steps_per_run: int = 2

    def __post_init__(self) -> None:
        if self.slots < self.executions:
            raise ValueError("slots: at least one slot record per execution")
        if not 0 < self.busy_schedules <= self.schedules:
            raise ValueError("busy_schedules: between 1 and schedules")


def schedule_name(number: int) -> str:
    return f"{NAME_PREFIX}{number:05d}"


def fill(conn: Connection, shape: HistoryShape, now: datetime) -> None:
    """Insert the history ending at ``now`` into an empty, migrated database, then ``ANALYZE``."""
    start = now - timedelta(days=shape.days)
    span_s = shape.days * 86400.0
    params = {
        "s": shape.schedules,
        "e": shape.executions,
        "extra": shape.slots - shape.executions,
        "busy": shape.busy_schedules,
        "steps": shape.steps_per_run,
        "t0": start,
        "now": now,
        "run_gap": span_s / shape.executions,
        "slot_gap": span_s / max(1, shape.slots - shape.executions),
        "prefix": NAME_PREFIX,
    }
    for statement in _STATEMENTS:
        conn.execute(text(statement.replace("_RUN_SCHEDULE", _RUN_SCHEDULE)), params)
    conn.commit()
    for table in ("schedules", "schedule_steps", "schedule_executions", "activities", "schedule_slots"):
        conn.execute(text(f"ANALYZE {table}"))
    conn.commit()


#: The schedule of run ``i``: every other run is a busy schedule's, the rest go round all schedules.
_RUN_SCHEDULE = "CASE WHEN i % 2 = 0 THEN (i / 2 - 1) % :busy + 1 ELSE (i - 1) / 2 % :s + 1 END"

_STATEMENTS = (
    # Schedules: the busy ones every minute (anchors spread over the minute), the others nightly
    # (cron, their minutes spread over the day), as a deployment of nightly jobs has them.
    """
    INSERT INTO schedules (id, name, source, status, enabled, cron, every_s, timezone, overlap, max_retries,
        retry_delay_s, total_repeats, payload, run_count, error_count, current_retry, last_run_at, next_run_at,
        last_slot_at, buffered, version, created_at, updated_at, changed_at)
    SELECT g, :prefix || lpad(g::text, 5, '0'), 'api', 'active', true,
        CASE WHEN g > :busy THEN (g % 60) || ' ' || (g / 60 % 24) || ' * * *' END,
        CASE WHEN g <= :busy THEN 60 END, 'UTC', 'skip', 0, 60, 0, '{}'::json,
        :e / :s, :e / :s / 50, 0, :now - interval '1 hour', NULL,
        NULL, false, 1, :t0, :t0 + (g % 60) * interval '1 second', :t0
    FROM generate_series(1, :s) AS g
    """,
    "SELECT setval('schedules_id_seq', :s)",
    """
    INSERT INTO schedule_steps (schedule_id, step_index, position, in_list, name, task, args, kwargs,
        continue_on_failure, max_attempts)
    SELECT g, k - 1, 0, false, 'step-' || k, 'chordbeat.examples.sleep', '[]'::json, '{"seconds": 0}'::json,
        false, 3
    FROM generate_series(1, :s) AS g, generate_series(1, :steps) AS k
    """,
    # Runs in time order.
    """
    INSERT INTO schedule_executions (id, schedule_id, schedule_name, status, trigger, run_key, current_step_index,
        plan, step_count, payload, started_at, completed_at, slot, error)
    SELECT i, sid, :prefix || lpad(sid::text, 5, '0'),
        CASE WHEN i % 50 = 0 THEN 'failed' ELSE 'completed' END, 'interval', 'hist:' || i, :steps - 1,
        (SELECT json_agg(json_build_array(json_build_object('name', 'step-' || k,
            'task', 'chordbeat.examples.sleep', 'kwargs', json_build_object('seconds', 0))))
         FROM generate_series(1, :steps) AS k),
        :steps, '{}'::json,
        :t0 + (i - 1) * :run_gap * interval '1 second',
        :t0 + ((i - 1) * :run_gap + 30 + i % 21
            + CASE WHEN sid % 100 = 7 AND i > :e * 0.9 THEN 60 ELSE 0 END) * interval '1 second',
        :t0 + ((i - 1) * :run_gap - 1) * interval '1 second',
        CASE WHEN i % 50 = 0 THEN 'step-' || :steps || ' failed: generated' END
    FROM (SELECT i, _RUN_SCHEDULE AS sid FROM generate_series(1, :e) AS i) AS runs
    """,
    "SELECT setval('schedule_executions_id_seq', :e)",
    """
    INSERT INTO activities (execution_id, step_index, step_name, attempt, status, worker, started_at, completed_at,
        error)
    SELECT i, k - 1, 'step-' || k, 1,
        CASE WHEN i % 50 = 0 AND k = :steps THEN 'failed_with_error' ELSE 'complete' END, 'celery@history',
        :t0 + ((i - 1) * :run_gap + (k - 1) * 20) * interval '1 second',
        :t0 + ((i - 1) * :run_gap + k * 20) * interval '1 second',
        CASE WHEN i % 50 = 0 AND k = :steps THEN 'failed: generated' END
    FROM generate_series(1, :e) AS i, generate_series(1, :steps) AS k
    ORDER BY i, k
    """,
    # One slot record per run and the busy schedules' skipped slots, ids in time order as they come.
    """
    INSERT INTO schedule_slots (schedule_id, schedule_name, nominal_at, trigger, outcome, execution_id, detail,
        recorded_at)
    SELECT sid, :prefix || lpad(sid::text, 5, '0'), at - interval '1 second', 'interval', outcome, eid, detail, at
    FROM (
        SELECT _RUN_SCHEDULE AS sid, :t0 + (i - 1) * :run_gap * interval '1 second' AS at, 'fired' AS outcome,
            i AS eid, NULL AS detail
        FROM generate_series(1, :e) AS i
        UNION ALL
        SELECT (j - 1) % :busy + 1, :t0 + (j - 1) * :slot_gap * interval '1 second', 'skipped_overlap', NULL,
            'the previous run is still in progress'
        FROM generate_series(1, :extra) AS j
    ) AS slots
    ORDER BY at
    """,
)
