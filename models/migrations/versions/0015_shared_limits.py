"""Shared limits: the limits, their holds and their waiters

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-28

Three new tables, empty: their indexes build at once.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "limits",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("definition", sa.JSON(), nullable=False),
        sa.Column("slots", sa.Integer(), nullable=False),
        sa.Column("per_key_slots", sa.Integer(), nullable=True),
        sa.Column("in_use", sa.Integer(), nullable=False),
        sa.Column("tokens", sa.Float(), nullable=True),
        sa.Column("tokens_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sqlite_autoincrement=True,
    )
    for table in ("limit_holds", "limit_waiters"):
        waiter = table == "limit_waiters"
        op.create_table(
            table,
            sa.Column("id", sa.Integer(), primary_key=True),
            sa.Column("limit_id", sa.Integer(), sa.ForeignKey("limits.id", ondelete="CASCADE"), nullable=False),
            sa.Column("worker_task_id", sa.Integer(), nullable=False),
            sa.Column("attempt", sa.Integer(), nullable=False),
            sa.Column("execution_id", sa.Integer(), nullable=False),
            sa.Column("step_name", sa.String(200), nullable=False),
            sa.Column("key", sa.String(200), nullable=False),
            sa.Column("slots", sa.Integer(), nullable=False),
            *(
                [
                    sa.Column("needs", sa.Integer(), nullable=False),
                    sa.Column("queue", sa.String(40), nullable=False),
                    sa.Column("turn", sa.Integer(), nullable=False),
                    sa.Column("enqueued_at", sa.DateTime(timezone=True), nullable=False),
                ]
                if waiter
                else [sa.Column("since", sa.DateTime(timezone=True), nullable=False)]
            ),
            sa.UniqueConstraint("worker_task_id", "attempt", "limit_id"),
            sqlite_autoincrement=True,
        )
    op.create_index("ix_limit_holds_limit_id_key", "limit_holds", ["limit_id", "key"])
    op.create_index("ix_limit_holds_limit_id_since", "limit_holds", ["limit_id", "since"])
    op.create_index("ix_limit_waiters_limit_id_turn_id", "limit_waiters", ["limit_id", "turn", "id"])
    op.create_index("ix_limit_waiters_queue_turn", "limit_waiters", ["queue", "turn"])


def downgrade() -> None:
    op.drop_index("ix_limit_waiters_queue_turn", table_name="limit_waiters")
    op.drop_index("ix_limit_waiters_limit_id_turn_id", table_name="limit_waiters")
    op.drop_index("ix_limit_holds_limit_id_since", table_name="limit_holds")
    op.drop_index("ix_limit_holds_limit_id_key", table_name="limit_holds")
    op.drop_table("limit_waiters")
    op.drop_table("limit_holds")
    op.drop_table("limits")
