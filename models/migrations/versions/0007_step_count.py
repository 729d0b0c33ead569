"""schedule_executions.step_count: steps in the plan, so lists count them without reading plans

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24

Nullable and not backfilled: adding it is a catalogue change on PostgreSQL (no table rewrite of
months of history), and lists count the plans of runs started before it in SQL.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("schedule_executions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("step_count", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("schedule_executions", schema=None) as batch_op:
        batch_op.drop_column("step_count")
