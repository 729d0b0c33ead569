"""Indexes for a database holding months of history: housekeeping, slot records, run strips

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24

Built ``CONCURRENTLY`` on PostgreSQL, so an upgrade of a populated database never blocks the
fires, steps and advancements writing to these tables (docs/scaling.md gives the build times).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

#: (index, table, columns) created by this revision.
CREATED = (
    ("ix_schedule_executions_schedule_id_id", "schedule_executions", ["schedule_id", "id"]),
    ("ix_schedule_executions_schedule_name_id", "schedule_executions", ["schedule_name", "id"]),
    ("ix_schedule_executions_completed_at", "schedule_executions", ["completed_at"]),
    ("ix_schedule_slots_schedule_name_id", "schedule_slots", ["schedule_name", "id"]),
    ("ix_schedule_slots_schedule_id_nominal_at", "schedule_slots", ["schedule_id", "nominal_at"]),
    ("ix_schedule_slots_execution_id", "schedule_slots", ["execution_id"]),
    ("ix_schedule_slots_recorded_at", "schedule_slots", ["recorded_at"]),
)
#: (index, table, columns) that the new ones make redundant (a leading prefix of a new one, or of
#: activities' unique constraint).
DROPPED = (
    ("ix_schedule_executions_schedule_id", "schedule_executions", ["schedule_id"]),
    ("ix_schedule_executions_schedule_name", "schedule_executions", ["schedule_name"]),
    ("ix_schedule_slots_schedule_nominal", "schedule_slots", ["schedule_name", "nominal_at"]),
    ("ix_activities_execution_id", "activities", ["execution_id"]),
)
RECOVERED_ATTEMPT = "error LIKE 'worker lost%' OR error LIKE 'timed out%'"


def _online() -> dict[str, Any]:
    return {"postgresql_concurrently": True} if op.get_bind().dialect.name == "postgresql" else {}


def upgrade() -> None:
    # CONCURRENTLY cannot run inside a transaction block.
    with op.get_context().autocommit_block():
        for name, table, columns in CREATED:
            op.create_index(name, table, columns, if_not_exists=True, **_online())
        op.create_index(
            "ix_activities_recovered",
            "activities",
            ["id"],
            postgresql_where=sa.text(RECOVERED_ATTEMPT),
            sqlite_where=sa.text(RECOVERED_ATTEMPT),
            if_not_exists=True,
            **_online(),
        )
        for name, table, _ in DROPPED:
            op.drop_index(name, table_name=table, if_exists=True, **_online())


def downgrade() -> None:
    with op.get_context().autocommit_block():
        for name, table, columns in DROPPED:
            op.create_index(name, table, columns, if_not_exists=True, **_online())
        op.drop_index("ix_activities_recovered", table_name="activities", if_exists=True, **_online())
        for name, table, _ in CREATED:
            op.drop_index(name, table_name=table, if_exists=True, **_online())
