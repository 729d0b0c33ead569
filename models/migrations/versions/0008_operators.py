"""Operators: the audit trail, who paused a schedule, a step's traceback and log tail, re-runs

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24

Every added column is nullable and not backfilled: on PostgreSQL each is a catalogue change, not
a rewrite of months of history. The audit table is new and empty, so its indexes build at once.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit_events",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(100), nullable=False),
        sa.Column("source", sa.String(32), nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("schedule_name", sa.String(200), nullable=True),
        sa.Column("execution_id", sa.Integer(), nullable=True),
        sa.Column("reason", sa.String(500), nullable=True),
        sa.Column("detail", sa.JSON(), nullable=True),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_audit_events_schedule_name_id", "audit_events", ["schedule_name", "id"])
    op.create_index("ix_audit_events_execution_id", "audit_events", ["execution_id"])
    op.create_index("ix_audit_events_at", "audit_events", ["at"])
    with op.batch_alter_table("schedules", schema=None) as batch_op:
        batch_op.add_column(sa.Column("paused_by", sa.String(100), nullable=True))
        batch_op.add_column(sa.Column("paused_reason", sa.String(500), nullable=True))
        batch_op.add_column(sa.Column("paused_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("schedule_executions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("rerun_of", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("rerun_from_group", sa.Integer(), nullable=True))
    with op.batch_alter_table("activities", schema=None) as batch_op:
        batch_op.add_column(sa.Column("traceback", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("log_tail", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("activities", schema=None) as batch_op:
        batch_op.drop_column("log_tail")
        batch_op.drop_column("traceback")
    with op.batch_alter_table("schedule_executions", schema=None) as batch_op:
        batch_op.drop_column("rerun_from_group")
        batch_op.drop_column("rerun_of")
    with op.batch_alter_table("schedules", schema=None) as batch_op:
        batch_op.drop_column("paused_at")
        batch_op.drop_column("paused_reason")
        batch_op.drop_column("paused_by")
    op.drop_index("ix_audit_events_at", table_name="audit_events")
    op.drop_index("ix_audit_events_execution_id", table_name="audit_events")
    op.drop_index("ix_audit_events_schedule_name_id", table_name="audit_events")
    op.drop_table("audit_events")
