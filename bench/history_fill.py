"""Ninety days of history, generated in SQL on PostgreSQL (``generate_series``), in seconds.

The shape follows a deployment that keeps the default retention: every schedule has runs spread
evenly over the days kept, each run two step attempts and one ``fired`` slot record; a few busy
schedules (every minute, mostly skipped because their runs overlap) have half the runs and most
slot records, the overload case where the slot table outgrows the executions ten to one. One run in fifty failed.
Runs take 30 to 50 s, started a second after their slot; the runs of one schedule in a hundred
take a minute longer over the last tenth of the history (getting slower, for the Runs page).
Every schedule has ``versions`` definition versions, one every ``days / versions``, as a team
editing its jobs makes them: each the canonical JSON text and SHA-256 a real change stores
(:func:`version_templates` builds them with the application's own code; they differ in the
schedule's ``retry_delay`` and its steps' ``max_attempts``, the last equal to the schedule's rows),
made by one of 40 people through the service, the CLI or a schedule file (its name and a commit id).
Each run ran the version current at its start. The versions of ``gone_schedules`` schedules deleted
since, which no kept run ran, are what housekeeping may delete once past the trail's retention.
Used by the benchmark's history scenario and, at a smaller scale, by the query-plan test.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection, text

from celeryapp.domain.definition_versions import canonical_json
from celeryapp.states import Overlap
from models.definitions import definition_of
from models.tables import Schedule, ScheduleStep

#: Names of the generated schedules: ``hist-00001`` …; nothing else in a test uses the prefix.
NAME_PREFIX = "hist-"
#: Names of schedules deleted since, whose versions are kept (``gone-00001`` …).
GONE_PREFIX = "gone-"
#: Where a template's name and cron expression go (replaced in SQL).
_NAME_MARK, _CRON_MARK = "@NAME@", "@CRON@"


@dataclass(frozen=True)
class HistoryShape:
    schedules: int = 10_000
    executions: int = 1_000_000
    slots: int = 13_000_000
    days: float = 90.0
    #: Schedules (the first ones) that hold the slot records beyond one per run.
    busy_schedules: int = 100
    steps_per_run: int = 2
    #: Definition versions of every schedule (its current definition is the last).
    versions: int = 50
    #: Deleted schedules whose versions (``versions`` each, no run refers to them) are kept.
    gone_schedules: int = 100

    def __post_init__(self) -> None:
        if self.slots < self.executions:
            raise ValueError("slots: at least one slot record per execution")
        if not 0 < self.busy_schedules <= self.schedules:
            raise ValueError("busy_schedules: between 1 and schedules")
        if self.versions < 1:
            raise ValueError("versions: at least 1")


def schedule_name(number: int) -> str:
    return f"{NAME_PREFIX}{number:05d}"


def retry_delay_at(version: int) -> int:
    """The generated schedules' ``retry_delay`` at ``version``."""
    return 10 + version


def max_attempts_at(version: int) -> int:
    """Their steps' ``max_attempts`` at ``version`` (3, the default, is left out of the text)."""
    return 1 + version % 3


def version_templates(shape: HistoryShape, *, busy: bool) -> list[str]:
    """The canonical text of every version (the first at index 0) of a busy (``every: 60``) or a
    nightly (cron) schedule, as :func:`celeryapp.scheduling.store.upsert_schedule` stores it, with
    :data:`_NAME_MARK` for the name and :data:`_CRON_MARK` for the cron expression."""
    texts = []
    for version in range(1, shape.versions + 1):
        schedule = Schedule(
            name=_NAME_MARK,
            cron=None if busy else _CRON_MARK,
            every_s=60.0 if busy else None,
            timezone="UTC",
            enabled=True,
            overlap=Overlap.SKIP,
            max_retries=0,
            retry_delay_s=float(retry_delay_at(version)),
            total_repeats=0,
            timeout_s=None,
            payload={},
        )
        schedule.steps = [
            ScheduleStep(
                step_index=k - 1,
                position=0,
                in_list=False,
                name=f"step-{k}",
                task="chordbeat.examples.sleep",
                args=[],
                kwargs={"seconds": 0},
                continue_on_failure=False,
                max_attempts=max_attempts_at(version),
            )
            for k in range(1, shape.steps_per_run + 1)
        ]
        texts.append(canonical_json(definition_of(schedule).to_json()))
    return texts


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
        "gone_prefix": GONE_PREFIX,
        "versions": shape.versions,
        "version_gap": span_s / shape.versions,
        "gone": shape.gone_schedules,
        "busy_texts": version_templates(shape, busy=True),
        "cron_texts": version_templates(shape, busy=False),
        "name_mark": _NAME_MARK,
        "cron_mark": _CRON_MARK,
        # The schedules' rows are their last version's definition.
        "retry_delay": retry_delay_at(shape.versions),
        "max_attempts": max_attempts_at(shape.versions),
    }
    for statement in _STATEMENTS:
        conn.execute(text(statement.replace("_RUN_SCHEDULE", _RUN_SCHEDULE)), params)
    conn.commit()
    for table in (
        "schedules",
        "schedule_steps",
        "schedule_executions",
        "activities",
        "schedule_slots",
        "schedule_versions",
    ):
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
        CASE WHEN g <= :busy THEN 60 END, 'UTC', 'skip', 0, :retry_delay, 0, '{}'::json,
        :e / :s, :e / :s / 50, 0, :now - interval '1 hour', NULL,
        NULL, false, :versions, :t0, :t0 + (g % 60) * interval '1 second', :t0
    FROM generate_series(1, :s) AS g
    """,
    "SELECT setval('schedules_id_seq', :s)",
    """
    INSERT INTO schedule_steps (schedule_id, step_index, position, in_list, name, task, args, kwargs,
        continue_on_failure, max_attempts)
    SELECT g, k - 1, 0, false, 'step-' || k, 'chordbeat.examples.sleep', '[]'::json, '{"seconds": 0}'::json,
        false, :max_attempts
    FROM generate_series(1, :s) AS g, generate_series(1, :steps) AS k
    """,
    # Runs in time order.
    """
    INSERT INTO schedule_executions (id, schedule_id, schedule_name, status, trigger, run_key, current_step_index,
        plan, step_count, payload, started_at, completed_at, slot, error, version)
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
        CASE WHEN i % 50 = 0 THEN 'step-' || :steps || ' failed: generated' END,
        1 + floor((i - 1) * :run_gap / :version_gap)::int
    FROM (SELECT i, _RUN_SCHEDULE AS sid FROM generate_series(1, :e) AS i) AS runs
    """,
    "SELECT setval('schedule_executions_id_seq', :e)",
    # Versions: schedule g's version v made at t0 + (v - 1) version gaps, a little before the runs
    # of that stretch; a file's (every third) names the file and a commit.
    """
    INSERT INTO schedule_versions (schedule_id, schedule_name, version, definition, hash, at, actor, source, reason,
        file, commit)
    SELECT sid, name, v, body, encode(sha256(convert_to(body, 'UTF8')), 'hex'),
        :t0 + ((v - 1) * :version_gap - g % 60 - 1) * interval '1 second',
        CASE WHEN v % 3 = 0 THEN 'chordbeat' ELSE 'ops-' || (g + v) % 40 END,
        CASE v % 3 WHEN 0 THEN 'beat' WHEN 1 THEN 'cli' ELSE 'service' END,
        CASE WHEN v % 3 = 1 THEN 'change ' || v || ' of ' || name END,
        CASE WHEN v % 3 = 0 THEN 'schedules/' || name || '.yaml' END,
        CASE WHEN v % 3 = 0 THEN substr(md5(name || v) || md5(v || name), 1, 40) END
    FROM (
        SELECT g, v, sid, name,
            replace(replace((CASE WHEN g <= :busy THEN CAST(:busy_texts AS text[]) ELSE CAST(:cron_texts AS text[])
                END)[v], :name_mark, name), :cron_mark, (g % 60) || ' ' || (g / 60 % 24) || ' * * *') AS body
        FROM (
            SELECT g, CASE WHEN g <= :s THEN g END AS sid,
                CASE WHEN g <= :s THEN :prefix || lpad(g::text, 5, '0')
                    ELSE :gone_prefix || lpad((g - :s)::text, 5, '0') END AS name
            FROM generate_series(1, :s + :gone) AS g
        ) AS named, generate_series(1, :versions) AS v
        ORDER BY v, g
    ) AS made
    """,
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
