"""Runs of several schedules started together in a few statements (a beat tick's fires)."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from sqlalchemy import update
from sqlalchemy.orm import Session

from celeryapp.domain.effects import Effects
from celeryapp.execution.run_rows import (
    StartResult,
    execution_row,
    execution_with_key,
    first_group,
    insert_ignoring_conflicts,
    insert_worker_tasks,
)
from celeryapp.execution.slot_records import SlotRow, record_slots
from models import Schedule, SlotOutcome, Trigger
from models.definitions import definition_of
from models.tables import EXECUTIONS


class Start(NamedTuple):
    """A run to start by :func:`start_executions`."""

    schedule: Schedule
    trigger: Trigger
    run_key: str
    nominal_at: datetime


def start_executions(session: Session, starts: list[Start], *, now: datetime) -> list[StartResult]:
    """Start runs of several schedules in a few statements, whatever their number (a beat tick's fires).

    The caller holds every schedule's row lock and found no active run of any that is not
    ``overlap: allow`` (what :func:`start_execution` checks first), and no schedule appears twice.
    A run key already used makes no run ("duplicate"), as in :func:`start_execution`.
    """
    definitions = [definition_of(start.schedule) for start in starts]
    rows = [
        execution_row(
            start.schedule, definition, trigger=start.trigger, run_key=start.run_key, now=now, slot=start.nominal_at
        )
        for start, definition in zip(starts, definitions, strict=True)
    ]
    inserted = session.connection().execute(
        insert_ignoring_conflicts(session).returning(EXECUTIONS.c.run_key, EXECUTIONS.c.id), rows
    )
    ids: dict[str, int] = {key: execution_id for key, execution_id in inserted}
    made = {ids[s.run_key]: d.groups for s, d in zip(starts, definitions, strict=True) if s.run_key in ids}
    task_ids = insert_worker_tasks(session, made, now=now) if made else {}
    results: list[StartResult] = []
    slots: list[SlotRow] = []
    for start, definition, row in zip(starts, definitions, rows, strict=True):
        execution_id = ids.get(start.run_key)
        if execution_id is None:
            # The row lock and the caller's check leave only one conflict: the run key's.
            results.append(StartResult(execution_with_key(session, start.run_key), skipped="duplicate"))
            continue
        group = first_group(
            start.schedule, definition.groups, execution_id, row["token"], task_ids[execution_id], start.trigger
        )
        results.append(StartResult(execution_id, effects=Effects(dispatch=[group])))
        slots.append(SlotRow(start.schedule, SlotOutcome.FIRED, start.trigger, start.nominal_at, execution_id))
    if slots:
        started_ids = [row.owner.id for row in slots]
        session.execute(update(Schedule).where(Schedule.id.in_(started_ids)).values(last_run_at=now))
        record_slots(session, slots, now=now)
    return results
