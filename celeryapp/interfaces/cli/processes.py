"""Commands beside the long-running processes: a liveness ``health`` check for container health
checks, the ``metrics`` exporter, the ``web`` dashboard and its ``web-password`` hashes."""

from __future__ import annotations

import sys

import click

from celeryapp.errors import ChordbeatError
from celeryapp.interfaces.cli.calls import built_app
from celeryapp.interfaces.terminal import printable


@click.command("health")
@click.argument("process", type=click.Choice(["worker", "beat"]))
def health_cmd(process: str) -> None:
    """Exit non-zero when the process's liveness file is stale or missing (for healthchecks)."""
    from celeryapp.config import Settings
    from celeryapp.monitoring.health import age_s, problem, stale_after_s

    settings = Settings.from_env()
    age = age_s(settings, process)
    limit = stale_after_s(settings, process)
    if age is None or age > limit:
        why = f"last beat {age:.0f}s ago" if age is not None else problem(settings) or "no liveness file"
        click.echo(printable(f"{process}: unhealthy ({why})"))
        sys.exit(1)
    click.echo(f"{process}: healthy (last beat {age:.1f}s ago)")


@click.command("metrics")
@click.option("--port", default=9808, show_default=True, type=int)
@click.option("--address", default="127.0.0.1", show_default=True, help="Interface to listen on.")
def metrics_cmd(port: int, address: str) -> None:
    """Serve Prometheus metrics about executions on /metrics."""
    from celeryapp.monitoring.metrics import serve

    click.echo(f"serving metrics on http://{address}:{port}/metrics")
    serve(built_app(), port, address)


@click.command("web")
def web_cmd() -> None:
    """Serve the dashboard (CHORDBEAT_WEB_* settings; refuses to start without accounts)."""
    from celeryapp.interfaces.web.auth import check_auth_config
    from celeryapp.interfaces.web.server import serve

    app = built_app()
    try:
        check_auth_config(app.settings.web_users, app.settings.web_secret)
    except ChordbeatError as exc:
        raise click.ClickException(printable(exc)) from None
    click.echo(f"dashboard on http://{app.settings.web_address}:{app.settings.web_port}/")
    serve(app)


@click.command("web-password")
@click.password_option()
def web_password_cmd(password: str) -> None:
    """Print a hash of a password for CHORDBEAT_WEB_USERS."""
    from celeryapp.interfaces.web.auth import hash_password

    click.echo(hash_password(password))
