"""metric_counts: monotonic counters and histogram buckets that housekeeping never deletes

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "metric_counts",
        sa.Column("metric", sa.String(length=64), nullable=False),
        sa.Column("schedule_name", sa.String(length=200), nullable=False),
        sa.Column("label", sa.String(length=32), nullable=False),
        sa.Column("bucket", sa.String(length=16), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.Column("total", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("metric", "schedule_name", "label", "bucket", name=op.f("pk_metric_counts")),
    )
    # The counters go on from what the kept history holds, so an upgrade is not a counter reset.
    op.execute(
        "INSERT INTO metric_counts (metric, schedule_name, label, bucket, count, total) "
        "SELECT 'executions', schedule_name, status, '', COUNT(*), 0 FROM schedule_executions "
        "WHERE status <> 'in_progress' GROUP BY schedule_name, status"
    )
    op.execute(
        "INSERT INTO metric_counts (metric, schedule_name, label, bucket, count, total) "
        "SELECT 'slots', schedule_name, outcome, '', COUNT(*), 0 FROM schedule_slots "
        "GROUP BY schedule_name, outcome"
    )


def downgrade() -> None:
    op.drop_table("metric_counts")
