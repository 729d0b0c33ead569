"""The Alembic migrations build exactly the schema the models describe, on SQLite and PostgreSQL."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from models import Base
from models.migrate import upgrade


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
