"""Runs written as rows, hours and days in the past (they cannot be waited for), for the Runs
page's and the duration trend's tests: the pages read them from the real database."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select

from celeryapp.application import ChordbeatCelery
from celeryapp.interfaces import service
from models import ExecutionStatus, Schedule, ScheduleExecution, Trigger, transaction

_keys = itertools.count(1)


@dataclass
class Run:
    ago: timedelta
    took_s: float | None = 30.0
    status: ExecutionStatus = ExecutionStatus.COMPLETED
    trigger: Trigger = Trigger.CRON
    #: Started this long after its slot; None: no slot (a manual run).
    late_s: float | None = 5.0
    error: str | None = None


def define(app: ChordbeatCelery, name: str, timezone: str = "UTC") -> None:
    step = {"name": "a", "task": "chordbeat.examples.sleep"}
    service.apply_schedule(app, {"name": name, "cron": "0 2 * * *", "timezone": timezone, "steps": [step]})


def write_runs(app: ChordbeatCelery, name: str, runs: list[Run], now: datetime) -> list[int]:
    """The runs as rows of the schedule ``name``, in the order given (ids ascending)."""
    ids = []
    with transaction(app.settings.database_url) as session:
        sid = session.scalar(select(Schedule.id).where(Schedule.name == name))
        for r in runs:
            started = now - r.ago
            row = ScheduleExecution(
                schedule_id=sid,
                schedule_name=name,
                status=r.status,
                trigger=r.trigger,
                run_key=f"history:{next(_keys)}:{started.timestamp()}",
                plan=[[{"name": "a", "task": "chordbeat.examples.sleep"}]],
                step_count=1,
                started_at=started,
                completed_at=None if r.took_s is None else started + timedelta(seconds=r.took_s),
                slot=None if r.late_s is None else started - timedelta(seconds=r.late_s),
                error=r.error,
            )
            session.add(row)
            session.flush()
            ids.append(row.id)
    return ids


def hourly(took: list[float]) -> list[Run]:
    """Completed runs an hour apart taking ``took`` seconds each, oldest first, the last 30 min ago."""
    return [Run(ago=timedelta(hours=len(took) - n - 0.5), took_s=s) for n, s in enumerate(took)]
