"""schedules.changed_at: when what beat's entry depends on last changed (incremental reconcile)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("schedules", schema=None) as batch_op:
        batch_op.add_column(sa.Column("changed_at", sa.DateTime(timezone=True), nullable=True))
    op.execute("UPDATE schedules SET changed_at = updated_at")
    with op.batch_alter_table("schedules", schema=None) as batch_op:
        batch_op.alter_column("changed_at", existing_type=sa.DateTime(timezone=True), nullable=False)
        batch_op.create_index(batch_op.f("ix_schedules_changed_at"), ["changed_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("schedules", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_schedules_changed_at"))
        batch_op.drop_column("changed_at")
