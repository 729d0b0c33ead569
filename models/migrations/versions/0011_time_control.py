"""Time control: catch-up and DST objects on schedules, runs' slots, and backfills

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25

The added columns are nullable and not backfilled (catalogue changes on PostgreSQL): a schedule
without ``catchup`` or ``dst`` keeps today's behaviour, and runs started before this revision show
no slot. The backfills table is new and empty, so its indexes build at once.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("schedules", schema=None) as batch_op:
        batch_op.add_column(sa.Column("catchup", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("dst", sa.JSON(), nullable=True))
    with op.batch_alter_table("schedule_executions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("slot", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("backfill_id", sa.Integer(), nullable=True))
    op.create_index("ix_schedule_executions_backfill_id", "schedule_executions", ["backfill_id"])
    op.create_table(
        "backfills",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("schedule_id", sa.Integer(), sa.ForeignKey("schedules.id", ondelete="SET NULL"), nullable=True),
        sa.Column("schedule_name", sa.String(200), nullable=False),
        sa.Column("origin", sa.String(32), nullable=False),
        sa.Column("mode", sa.String(32), nullable=False),
        sa.Column("range_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("range_end", sa.DateTime(timezone=True), nullable=False),
        sa.Column("slots", sa.JSON(), nullable=False),
        sa.Column("started", sa.Integer(), nullable=False),
        sa.Column("max_concurrent", sa.Integer(), nullable=False),
        sa.Column("not_before", sa.DateTime(timezone=True), nullable=True),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("request_key", sa.String(400), nullable=True, unique=True),
        sa.Column("actor", sa.String(100), nullable=True),
        sa.Column("reason", sa.String(500), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_backfills_schedule_name_id", "backfills", ["schedule_name", "id"])
    op.create_index("ix_backfills_status", "backfills", ["status"])
    op.create_index("ix_backfills_schedule_id", "backfills", ["schedule_id"])


def downgrade() -> None:
    op.drop_index("ix_backfills_schedule_id", table_name="backfills")
    op.drop_index("ix_backfills_status", table_name="backfills")
    op.drop_index("ix_backfills_schedule_name_id", table_name="backfills")
    op.drop_table("backfills")
    op.drop_index("ix_schedule_executions_backfill_id", table_name="schedule_executions")
    with op.batch_alter_table("schedule_executions", schema=None) as batch_op:
        batch_op.drop_column("backfill_id")
        batch_op.drop_column("slot")
    with op.batch_alter_table("schedules", schema=None) as batch_op:
        batch_op.drop_column("dst")
        batch_op.drop_column("catchup")
