"""Definition versions: every definition a schedule had, and the version each run runs

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-28

Every existing schedule gets version 1, its definition as stored now (its earlier definitions
were never kept), so no schedule is ever without a version; ``schedules.version`` (bumped by
every change before, read by nothing) restarts at 1 with it. Runs started before this revision
have no version, and backfills name none (they run the current one). The index on
schedule_executions is built ``CONCURRENTLY`` on PostgreSQL, so an upgrade of a populated
database does not block the runs writing to it.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

EXECUTIONS_INDEX = "ix_schedule_executions_schedule_name_version_id"


def upgrade() -> None:
    op.create_table(
        "schedule_versions",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("schedule_id", sa.Integer(), sa.ForeignKey("schedules.id", ondelete="SET NULL"), nullable=True),
        sa.Column("schedule_name", sa.String(200), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("definition", sa.Text(), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(100), nullable=False),
        sa.Column("source", sa.String(32), nullable=False),
        sa.Column("reason", sa.String(500), nullable=True),
        sa.Column("file", sa.String(500), nullable=True),
        sa.Column("commit", sa.String(80), nullable=True),
        sa.UniqueConstraint("schedule_id", "version"),
        sqlite_autoincrement=True,
    )
    for table in ("schedule_executions", "backfills"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column("version", sa.Integer(), nullable=True))
    _first_versions()
    online: dict[str, Any] = {"postgresql_concurrently": True} if op.get_bind().dialect.name == "postgresql" else {}
    # CONCURRENTLY cannot run inside a transaction block.
    with op.get_context().autocommit_block():
        op.create_index(
            EXECUTIONS_INDEX, "schedule_executions", ["schedule_name", "version", "id"], if_not_exists=True, **online
        )


def _first_versions() -> None:
    """Version 1 of every schedule: its definition read as the application reads it, from the
    rows as they are at this revision (reflected: the models may have moved on since)."""
    from celeryapp.domain.definition_versions import canonical_json, definition_hash
    from celeryapp.states import Overlap
    from models.base import utcnow
    from models.definitions import definition_of
    from models.tables import Schedule, ScheduleStep

    bind = op.get_bind()
    metadata = sa.MetaData()
    schedules = sa.Table("schedules", metadata, autoload_with=bind)
    steps = sa.Table("schedule_steps", metadata, autoload_with=bind)
    versions = sa.Table("schedule_versions", metadata, autoload_with=bind)
    schedule_fields, step_fields = set(Schedule.__mapper__.columns.keys()), set(ScheduleStep.__mapper__.columns.keys())
    steps_of: dict[int, list[ScheduleStep]] = {}
    for row in bind.execute(sa.select(steps)).mappings():
        steps_of.setdefault(row["schedule_id"], []).append(
            ScheduleStep(**{k: v for k, v in row.items() if k in step_fields and k != "schedule_id"})
        )
    rows = bind.execute(sa.select(schedules)).mappings().all()
    if not rows:
        return  # nothing to version, and no reference clock to read (make run upgrades before Redis starts)
    now = utcnow()
    for row in rows:
        values = {k: v for k, v in row.items() if k in schedule_fields and k not in ("status", "source", "overlap")}
        schedule = Schedule(**values, overlap=Overlap(row["overlap"]))
        schedule.steps = steps_of.get(row["id"], [])
        text = canonical_json(definition_of(schedule).to_json())
        bind.execute(
            sa.insert(versions).values(
                schedule_id=row["id"],
                schedule_name=row["name"],
                version=1,
                definition=text,
                hash=definition_hash(text),
                at=now,
                actor="chordbeat",
                source="beat",
                reason="the definition stored when versions began (revision 0018)",
            )
        )
    bind.execute(sa.update(schedules).values(version=1))


def downgrade() -> None:
    op.drop_index(EXECUTIONS_INDEX, table_name="schedule_executions")
    for table in ("backfills", "schedule_executions"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column("version")
    op.drop_table("schedule_versions")
