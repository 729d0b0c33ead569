"""Audit filters: who did it and what, for the dashboard's Audit page and ``chordbeat audit``

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-28

The global audit list filters by actor or by action, newest first: each filter walks its own
index with the id, so a filter reads a page of rows, not the whole trail (tests/test_query_plans.py).
"""

from __future__ import annotations

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_audit_events_actor_id", "audit_events", ["actor", "id"])
    op.create_index("ix_audit_events_action_id", "audit_events", ["action", "id"])


def downgrade() -> None:
    op.drop_index("ix_audit_events_action_id", table_name="audit_events")
    op.drop_index("ix_audit_events_actor_id", table_name="audit_events")
