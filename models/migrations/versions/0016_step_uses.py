"""Shared limits used by steps: a schedule's and each step's ``uses``

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-28

Two nullable JSON columns (None: the schedule or step uses no limit), added without a rewrite.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("schedules", sa.Column("uses", sa.JSON(), nullable=True))
    op.add_column("schedule_steps", sa.Column("uses", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("schedule_steps") as batch:
        batch.drop_column("uses")
    with op.batch_alter_table("schedules") as batch:
        batch.drop_column("uses")
