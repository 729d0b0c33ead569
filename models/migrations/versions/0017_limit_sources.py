"""limits.source_name: which schedule file declared a limit; a limit's oldest waiter by index

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-28

Limits defined before this (through the service tasks) belong to no file: NULL. The index on
limit_waiters (limit_id, enqueued_at) finds a limit's oldest waiter without reading its queue.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("limits", schema=None) as batch_op:
        batch_op.add_column(sa.Column("source_name", sa.String(length=200), nullable=True))
    op.create_index("ix_limit_waiters_limit_id_enqueued_at", "limit_waiters", ["limit_id", "enqueued_at"])


def downgrade() -> None:
    op.drop_index("ix_limit_waiters_limit_id_enqueued_at", table_name="limit_waiters")
    with op.batch_alter_table("limits", schema=None) as batch_op:
        batch_op.drop_column("source_name")
