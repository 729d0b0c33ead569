"""What every command shares: the console, the app built on first use, the reference clock, and
the service calls through a client whose failures are said as the command's error."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import click
from celery.exceptions import TimeoutError as CeleryTimeout
from rich.console import Console

from celeryapp.interfaces.terminal import printable, text_of

console = Console()


def built_app() -> Any:
    from celeryapp import app

    app.loader.import_default_modules()
    return app


def reference_now() -> datetime:
    """The reference clock's time (installed by the app: Redis's clock), not this host's."""
    from models import utcnow

    built_app()
    return utcnow()


def new_client() -> Any:
    from celeryapp.client import ChordbeatClient

    settings = built_app().settings
    return ChordbeatClient(settings.broker_url, settings.result_backend, sentinel_master=settings.sentinel_master)


#: Said when no worker answers: the service tasks behind every command but ``apply``, ``db`` and
#: ``health`` need one.
NO_WORKER = (
    "no chordbeat worker is consuming the '{queue}' queue (none answered within {seconds:.0f} s); "
    "start one: `celery -A celeryapp worker -l INFO` (or `make run`), or a control worker with "
    "`-Q chordbeat.control,celery`"
)
_worker_seen = False


def forget_worker() -> None:
    """Each invocation checks for a worker once, afresh (tests run many in one process)."""
    global _worker_seen
    _worker_seen = False


def require_worker(client: Any) -> None:
    """Fail in seconds, saying what to start, instead of waiting out the call's timeout."""
    global _worker_seen
    from celeryapp.client import DEFAULT_PROBE_S, SERVICE_QUEUE

    if _worker_seen:
        return
    if not client.worker_listening(DEFAULT_PROBE_S):
        raise click.ClickException(NO_WORKER.format(queue=SERVICE_QUEUE, seconds=DEFAULT_PROBE_S))
    _worker_seen = True


def call(method: str, *args: Any, **kwargs: Any) -> Any:
    with connected() as client:
        return getattr(client, method)(*args, **kwargs)


@contextmanager
def connected() -> Iterator[Any]:
    """A client for a command's calls; what goes wrong is said as the command's error."""
    client = new_client()
    try:
        require_worker(client)
        yield client
    except click.ClickException:
        raise
    except CeleryTimeout:
        raise click.ClickException(
            f"no answer within {client.timeout_s:.0f} s (workers busy?); a request no worker took by then "
            "expires and does nothing"
        ) from None
    except Exception as exc:  # the worker's message names what is wrong
        raise click.ClickException(printable(exc)) from None
    finally:
        client.close()


def zones_for(names: Iterable[str]) -> dict[str, ZoneInfo]:
    from celeryapp.interfaces.listing import zones_of

    with connected() as client:
        return zones_of(client, set(names))


def echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2))


def print_errors(executions: list[dict[str, Any]]) -> None:
    for e in executions:
        if e["error"]:
            console.print(text_of(f"{e['id']}: ", "bold"), text_of(e["error"], "red"), sep="")


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
