"""Business calendars: the definition's calendar object on schedules

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24

Nullable and not backfilled (a catalogue change on PostgreSQL): a schedule without a calendar
runs every day, as before.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("schedules", schema=None) as batch_op:
        batch_op.add_column(sa.Column("calendar", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("schedules", schema=None) as batch_op:
        batch_op.drop_column("calendar")
