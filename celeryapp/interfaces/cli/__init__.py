"""The ``chordbeat`` command: operations through the same service tasks other services call.

One module per command group: ``files`` (``db upgrade``, ``apply``: on the database directly,
before any worker exists), ``schedules``, ``runs`` (with ``watch``, following one live),
``backfills``, ``audit``, ``versions``,
``alerts``, ``limits``, ``processes`` (``health`` reads local liveness files; ``metrics``, ``web``); ``calls``
holds what they share.

Each command imports what it needs when it runs, not at module import (the one place that imports
inside functions): ``chordbeat health`` runs as a container health check every few seconds and
stays small and quick without Celery, SQLAlchemy or the app, and touching ``celeryapp.app`` builds
the app from the environment, which only the commands that call the service need.
"""

from __future__ import annotations

import logging

import click

from celeryapp.interfaces.cli import alerts, audit, backfills, files, limits, processes, runs, schedules, versions
from celeryapp.interfaces.cli.calls import forget_worker


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Log at INFO level.")
def main(verbose: bool) -> None:
    """Scheduled multi-step executions on Celery."""
    forget_worker()
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )


for _command in (
    files.db,
    files.apply_cmd,
    schedules.list_cmd,
    schedules.show_cmd,
    schedules.next_cmd,
    runs.run_cmd,
    runs.execution_cmd,
    runs.executions_cmd,
    runs.cancel_cmd,
    runs.rerun_cmd,
    backfills.backfill_cmd,
    backfills.backfills_cmd,
    schedules.pause_cmd,
    schedules.resume_cmd,
    schedules.delete_cmd,
    versions.versions_cmd,
    versions.diff_cmd,
    versions.rollback_cmd,
    audit.audit_cmd,
    alerts.alerts_cmd,
    limits.limits_cmd,
    processes.health_cmd,
    processes.metrics_cmd,
    processes.web_cmd,
    processes.web_password_cmd,
):
    main.add_command(_command)
