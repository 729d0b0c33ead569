"""The ``chordbeat`` command."""

from __future__ import annotations

import json
import logging
from typing import Any

import click

from celeryapp.errors import ChordbeatError


def _app() -> Any:
    from celeryapp import app

    app.loader.import_default_modules()
    return app


def _echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=False))


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Log at INFO level.")
def main(verbose: bool) -> None:
    """Scheduled multi-step executions on Celery."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )


@main.group()
def db() -> None:
    """Database schema."""


@db.command("upgrade")
def db_upgrade() -> None:
    """Create or migrate the schema (idempotent)."""
    from models.migrate import upgrade

    app = _app()
    upgrade(app.settings.database_url)
    click.echo("database is up to date")


@main.command("apply")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--dry-run", is_flag=True, help="Show what would change; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the diff as JSON.")
def apply_cmd(path: str, dry_run: bool, as_json: bool) -> None:
    """Apply a declarative schedule file (file schedules override stored ones)."""
    from celeryapp.schedule_file import apply_file

    app = _app()
    try:
        diff = apply_file(app, path, dry_run=dry_run)
    except ChordbeatError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        _echo_json({"dry_run": dry_run, **diff.as_json()})
        return
    prefix = "would change" if dry_run else "applied"
    click.echo(f"{prefix}: {diff.summary()}")
