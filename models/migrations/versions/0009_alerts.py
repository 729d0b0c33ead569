"""Deadlines and alerts: the definition's two objects, the alert outbox, deliveries and silences

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24

The schedules' two columns are nullable and not backfilled (a catalogue change on PostgreSQL); the
three tables are new and empty, so their indexes build at once.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("schedules", schema=None) as batch_op:
        batch_op.add_column(sa.Column("deadlines", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("alerts", sa.JSON(), nullable=True))
    op.create_table(
        "alerts",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("key", sa.String(400), nullable=False, unique=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("detail", sa.String(32), nullable=True),
        sa.Column("schedule_name", sa.String(200), nullable=False),
        sa.Column("slot_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("execution_id", sa.Integer(), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expected_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("silenced", sa.Boolean(), nullable=False),
        sa.Column("acknowledged_by", sa.String(100), nullable=True),
        sa.Column("acknowledged_at", sa.DateTime(timezone=True), nullable=True),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_alerts_schedule_name_id", "alerts", ["schedule_name", "id"])
    op.create_index("ix_alerts_at", "alerts", ["at"])
    op.create_table(
        "alert_deliveries",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("alert_id", sa.Integer(), sa.ForeignKey("alerts.id", ondelete="CASCADE"), nullable=False),
        sa.Column("channel", sa.String(32), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_try_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.UniqueConstraint("alert_id", "channel"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_alert_deliveries_status_next_try_at", "alert_deliveries", ["status", "next_try_at"])
    op.create_table(
        "alert_silences",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("schedule_name", sa.String(200), nullable=False),
        sa.Column("until", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(100), nullable=False),
        sa.Column("reason", sa.String(500), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_alert_silences_schedule_name_until", "alert_silences", ["schedule_name", "until"])


def downgrade() -> None:
    op.drop_index("ix_alert_silences_schedule_name_until", table_name="alert_silences")
    op.drop_table("alert_silences")
    op.drop_index("ix_alert_deliveries_status_next_try_at", table_name="alert_deliveries")
    op.drop_table("alert_deliveries")
    op.drop_index("ix_alerts_at", table_name="alerts")
    op.drop_index("ix_alerts_schedule_name_id", table_name="alerts")
    op.drop_table("alerts")
    with op.batch_alter_table("schedules", schema=None) as batch_op:
        batch_op.drop_column("alerts")
        batch_op.drop_column("deadlines")
