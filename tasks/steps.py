"""The step runner: the header task of every step group's chord."""

from __future__ import annotations

from typing import Any

from celery import Task

from celeryapp import app, runner


@app.task(name="chordbeat.run_step", bind=True, acks_late=True, reject_on_worker_lost=True)
def run_step(self: Task, worker_task_id: int, attempt: int) -> dict[str, Any]:
    return runner.run_step(app, worker_task_id, attempt, node=self.request.hostname or "unknown")
