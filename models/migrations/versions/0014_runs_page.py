"""Runs page: every run newest first by start, filtered by trigger or schedule name

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-28

The dashboard's Runs page pages by the key (started_at, id): one index per filter that walks it
(state: the existing (status, started_at)), so a page reads a page of runs, not the history
(tests/test_query_plans.py).
"""

from __future__ import annotations

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_schedule_executions_started_at_id", "schedule_executions", ["started_at", "id"])
    op.create_index("ix_schedule_executions_trigger_started", "schedule_executions", ["trigger", "started_at", "id"])
    op.create_index(
        "ix_schedule_executions_schedule_name_started", "schedule_executions", ["schedule_name", "started_at", "id"]
    )


def downgrade() -> None:
    op.drop_index("ix_schedule_executions_schedule_name_started", table_name="schedule_executions")
    op.drop_index("ix_schedule_executions_trigger_started", table_name="schedule_executions")
    op.drop_index("ix_schedule_executions_started_at_id", table_name="schedule_executions")
