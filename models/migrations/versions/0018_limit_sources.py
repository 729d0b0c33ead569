"""limits.source_name: which schedule file declared a limit

Revision ID: 0018
Revises: 0015
Create Date: 2026-11-28

Limits defined before this (through the service tasks) belong to no file: NULL.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("limits", schema=None) as batch_op:
        batch_op.add_column(sa.Column("source_name", sa.String(length=200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("limits", schema=None) as batch_op:
        batch_op.drop_column("source_name")
