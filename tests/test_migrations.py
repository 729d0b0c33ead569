"""The Alembic migrations build exactly the schema the models describe, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from models import Base
from models.migrate import upgrade

pytestmark = pytest.mark.both_databases


def test_migrated_schema_matches_the_models(database_url: str) -> None:
    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            diff = compare_metadata(MigrationContext.configure(connection, opts={"compare_type": True}), Base.metadata)
        assert diff == [], f"models and migrations disagree: {diff}"
    finally:
        engine.dispose()


def test_upgrade_is_idempotent(database_url: str) -> None:
    upgrade(database_url)
    upgrade(database_url)
    engine = create_engine(database_url)
    try:
        assert {
            "schedules",
            "schedule_steps",
            "schedule_executions",
            "worker_tasks",
            "activities",
            "schedule_slots",
            "alembic_version",
        } <= set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_schedules_applied_from_a_file_before_sources_belong_to_the_source_schedules(database_url: str) -> None:
    from alembic import command
    from sqlalchemy import text

    from models.migrate import alembic_config

    command.downgrade(alembic_config(database_url), "0002")
    engine = create_engine(database_url)
    try:
        with engine.begin() as connection:
            for name, source in (("from-file", "file"), ("from-api", "api")):
                connection.execute(
                    text(
                        "INSERT INTO schedules (name, source, status, enabled, timezone, overlap, max_retries,"
                        " retry_delay_s, total_repeats, payload, run_count, error_count, current_retry, buffered,"
                        " version, created_at, updated_at) VALUES (:name, :source, 'active', true, 'UTC', 'skip',"
                        " 0, 60, 0, '{}', 0, 0, 0, false, 1, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                    ),
                    {"name": name, "source": source},
                )
        upgrade(database_url)
        with engine.connect() as connection:
            rows = dict(connection.execute(text("SELECT name, source_name FROM schedules")).all())
        assert rows == {"from-file": "schedules", "from-api": None}
    finally:
        engine.dispose()
