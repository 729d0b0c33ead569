"""schedules.source_name: which schedule file declared a file-sourced schedule

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22

Schedules applied from a file before sources existed get the source ``schedules``: the name a
file called ``schedules.yaml`` (the one beat applies in the shipped deployments) gets by default.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("schedules", schema=None) as batch_op:
        batch_op.add_column(sa.Column("source_name", sa.String(length=200), nullable=True))
    op.execute("UPDATE schedules SET source_name = 'schedules' WHERE source = 'file'")


def downgrade() -> None:
    with op.batch_alter_table("schedules", schema=None) as batch_op:
        batch_op.drop_column("source_name")
