"""Run token: a random number per run that names its Redis keys and Celery task ids

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-28

A database that went back (a failover to an asynchronous standby) hands out again ids that Redis
already knows: the run's token, drawn at random when the run starts, keeps the new run's keys
apart from the lost one's. Runs started before this revision have token 0, which names their keys
as before, so that messages in flight during the upgrade still find them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("schedule_executions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("token", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("schedule_executions", schema=None) as batch_op:
        batch_op.drop_column("token")
