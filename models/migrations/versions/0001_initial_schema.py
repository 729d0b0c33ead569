"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column(
            "source", sa.Enum("api", "file", name="schedulesource", native_enum=False, length=32), nullable=False
        ),
        sa.Column(
            "status",
            sa.Enum("active", "paused", "done", "dead", name="schedulestatus", native_enum=False, length=32),
            nullable=False,
        ),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("cron", sa.String(length=200), nullable=True),
        sa.Column("every_s", sa.Float(), nullable=True),
        sa.Column("timezone", sa.String(length=64), nullable=False),
        sa.Column(
            "overlap",
            sa.Enum("skip", "buffer_one", "cancel_previous", "allow", name="overlap", native_enum=False, length=32),
            nullable=False,
        ),
        sa.Column("max_retries", sa.Integer(), nullable=False),
        sa.Column("retry_delay_s", sa.Float(), nullable=False),
        sa.Column("total_repeats", sa.Integer(), nullable=False),
        sa.Column("timeout_s", sa.Float(), nullable=True),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("run_count", sa.Integer(), nullable=False),
        sa.Column("error_count", sa.Integer(), nullable=False),
        sa.Column("current_retry", sa.Integer(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("last_run_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("next_run_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("retry_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("buffered", sa.Boolean(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_schedules")),
        sa.UniqueConstraint("name", name=op.f("uq_schedules_name")),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "schedule_executions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("schedule_id", sa.Integer(), nullable=True),
        sa.Column("schedule_name", sa.String(length=200), nullable=False),
        sa.Column(
            "status",
            sa.Enum(
                "in_progress", "completed", "failed", "cancelled", name="executionstatus", native_enum=False, length=32
            ),
            nullable=False,
        ),
        sa.Column(
            "trigger",
            sa.Enum("cron", "interval", "manual", "retry", name="trigger", native_enum=False, length=32),
            nullable=False,
        ),
        sa.Column("run_key", sa.String(length=400), nullable=False),
        sa.Column("exclusive_key", sa.Integer(), nullable=True),
        sa.Column("current_step_index", sa.Integer(), nullable=False),
        sa.Column("plan", sa.JSON(), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("deadline_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["schedule_id"],
            ["schedules.id"],
            name=op.f("fk_schedule_executions_schedule_id_schedules"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_schedule_executions")),
        sa.UniqueConstraint("exclusive_key", name=op.f("uq_schedule_executions_exclusive_key")),
        sa.UniqueConstraint("run_key", name=op.f("uq_schedule_executions_run_key")),
        sqlite_autoincrement=True,
    )
    with op.batch_alter_table("schedule_executions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_schedule_executions_schedule_id"), ["schedule_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_schedule_executions_schedule_name"), ["schedule_name"], unique=False)
        batch_op.create_index("ix_schedule_executions_status_started", ["status", "started_at"], unique=False)

    op.create_table(
        "schedule_steps",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("schedule_id", sa.Integer(), nullable=False),
        sa.Column("step_index", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("in_list", sa.Boolean(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("task", sa.String(length=200), nullable=False),
        sa.Column("args", sa.JSON(), nullable=False),
        sa.Column("kwargs", sa.JSON(), nullable=False),
        sa.Column("continue_on_failure", sa.Boolean(), nullable=False),
        sa.Column("timeout_s", sa.Float(), nullable=True),
        sa.Column("queue", sa.String(length=200), nullable=True),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["schedule_id"], ["schedules.id"], name=op.f("fk_schedule_steps_schedule_id_schedules"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_schedule_steps")),
        sa.UniqueConstraint("schedule_id", "name", name=op.f("uq_schedule_steps_schedule_id_name")),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "activities",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("execution_id", sa.Integer(), nullable=False),
        sa.Column("step_index", sa.Integer(), nullable=False),
        sa.Column("step_name", sa.String(length=200), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column(
            "status",
            sa.Enum(
                "in_progress",
                "complete",
                "complete_with_warning",
                "complete_with_error",
                "failed_with_error",
                "cancelled",
                name="activitystatus",
                native_enum=False,
                length=32,
            ),
            nullable=False,
        ),
        sa.Column("worker", sa.String(length=200), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["execution_id"],
            ["schedule_executions.id"],
            name=op.f("fk_activities_execution_id_schedule_executions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_activities")),
        sa.UniqueConstraint(
            "execution_id", "step_name", "attempt", name=op.f("uq_activities_execution_id_step_name_attempt")
        ),
        sqlite_autoincrement=True,
    )
    with op.batch_alter_table("activities", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_activities_execution_id"), ["execution_id"], unique=False)

    op.create_table(
        "schedule_slots",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("schedule_id", sa.Integer(), nullable=True),
        sa.Column("schedule_name", sa.String(length=200), nullable=False),
        sa.Column("nominal_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "trigger",
            sa.Enum("cron", "interval", "manual", "retry", name="trigger", native_enum=False, length=32),
            nullable=False,
        ),
        sa.Column(
            "outcome",
            sa.Enum(
                "fired",
                "skipped_overlap",
                "skipped_paused",
                "buffered",
                "retry",
                name="slotoutcome",
                native_enum=False,
                length=32,
            ),
            nullable=False,
        ),
        sa.Column("execution_id", sa.Integer(), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["execution_id"],
            ["schedule_executions.id"],
            name=op.f("fk_schedule_slots_execution_id_schedule_executions"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["schedule_id"], ["schedules.id"], name=op.f("fk_schedule_slots_schedule_id_schedules"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_schedule_slots")),
        sqlite_autoincrement=True,
    )
    with op.batch_alter_table("schedule_slots", schema=None) as batch_op:
        batch_op.create_index("ix_schedule_slots_schedule_nominal", ["schedule_name", "nominal_at"], unique=False)

    op.create_table(
        "worker_tasks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("execution_id", sa.Integer(), nullable=False),
        sa.Column("step_index", sa.Integer(), nullable=False),
        sa.Column("step_name", sa.String(length=200), nullable=False),
        sa.Column(
            "status",
            sa.Enum(
                "waiting_for_previous_step",
                "queued",
                "processing",
                name="workertaskstatus",
                native_enum=False,
                length=32,
            ),
            nullable=False,
        ),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(length=200), nullable=True),
        sa.Column("queued_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["execution_id"],
            ["schedule_executions.id"],
            name=op.f("fk_worker_tasks_execution_id_schedule_executions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_worker_tasks")),
        sa.UniqueConstraint("execution_id", "step_name", name=op.f("uq_worker_tasks_execution_id_step_name")),
        sqlite_autoincrement=True,
    )
    with op.batch_alter_table("worker_tasks", schema=None) as batch_op:
        batch_op.create_index("ix_worker_tasks_status", ["status"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("worker_tasks", schema=None) as batch_op:
        batch_op.drop_index("ix_worker_tasks_status")

    op.drop_table("worker_tasks")
    with op.batch_alter_table("schedule_slots", schema=None) as batch_op:
        batch_op.drop_index("ix_schedule_slots_schedule_nominal")

    op.drop_table("schedule_slots")
    with op.batch_alter_table("activities", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_activities_execution_id"))

    op.drop_table("activities")
    op.drop_table("schedule_steps")
    with op.batch_alter_table("schedule_executions", schema=None) as batch_op:
        batch_op.drop_index("ix_schedule_executions_status_started")
        batch_op.drop_index(batch_op.f("ix_schedule_executions_schedule_name"))
        batch_op.drop_index(batch_op.f("ix_schedule_executions_schedule_id"))

    op.drop_table("schedule_executions")
    op.drop_table("schedules")
