"""The ``chordbeat`` command: operations through the same service tasks other services call.

``db upgrade`` and ``apply`` work on the database directly: they run before any worker exists
(deploy jobs, ``make run``). ``health`` reads local liveness files.

Each command imports what it needs when it runs, not at module import (the one place that imports
inside functions): ``chordbeat health`` runs as a container health check every few seconds and
stays small and quick without Celery, SQLAlchemy or the app, and touching ``celeryapp.app`` builds
the app from the environment, which only the commands that call the service need.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import click
from celery.exceptions import TimeoutError as CeleryTimeout
from rich.console import Console, Group
from rich.text import Text

from celeryapp.errors import ChordbeatError
from celeryapp.interfaces.terminal import (
    FINISHED_STEP,
    bar_style,
    cadence_text,
    definition_table,
    execution_view,
    new_table,
    printable,
    state_text,
    text_of,
    time_cell,
)

console = Console()


def _app() -> Any:
    from celeryapp import app

    app.loader.import_default_modules()
    return app


def _now() -> datetime:
    """The reference clock's time (installed by the app: Redis's clock), not this host's."""
    from models import utcnow

    _app()
    return utcnow()


def _client() -> Any:
    from celeryapp.client import ChordbeatClient

    settings = _app().settings
    return ChordbeatClient(settings.broker_url, settings.result_backend, sentinel_master=settings.sentinel_master)


#: Said when no worker answers: the service tasks behind every command but ``apply``, ``db`` and
#: ``health`` need one.
NO_WORKER = (
    "no chordbeat worker is consuming the '{queue}' queue (none answered within {seconds:.0f} s); "
    "start one: `celery -A celeryapp worker -l INFO` (or `make run`), or a control worker with "
    "`-Q chordbeat.control,celery`"
)
_worker_seen = False


def _require_worker(client: Any) -> None:
    """Fail in seconds, saying what to start, instead of waiting out the call's timeout."""
    global _worker_seen
    from celeryapp.client import DEFAULT_PROBE_S, SERVICE_QUEUE

    if _worker_seen:
        return
    if not client.worker_listening(DEFAULT_PROBE_S):
        raise click.ClickException(NO_WORKER.format(queue=SERVICE_QUEUE, seconds=DEFAULT_PROBE_S))
    _worker_seen = True


def _call(method: str, *args: Any, **kwargs: Any) -> Any:
    with _connected() as client:
        return getattr(client, method)(*args, **kwargs)


@contextmanager
def _connected() -> Iterator[Any]:
    """A client for a command's calls; what goes wrong is said as the command's error."""
    client = _client()
    try:
        _require_worker(client)
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


def _echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2))


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Log at INFO level.")
def main(verbose: bool) -> None:
    """Scheduled multi-step executions on Celery."""
    global _worker_seen
    _worker_seen = False
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

    upgrade(_app().settings.database_url)
    click.echo("database is up to date")


@main.command("apply")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--dry-run", is_flag=True, help="Show what would change; change nothing.")
@click.option("--yes", "--prune", "yes", is_flag=True, help="Remove the file's dropped schedules without asking.")
@json_option
def apply_cmd(path: str, dry_run: bool, yes: bool, as_json: bool) -> None:
    """Apply a declarative schedule file (file schedules override stored ones).

    Only schedules of the file's own source (its 'source:', by default its name without the
    extension) that it no longer names are removed, after confirmation.
    """
    from celeryapp.scheduling.schedule_file import apply_file

    app = _app()
    try:
        diff = apply_file(app, path, dry_run=True)
        if not dry_run:
            remove: bool | list[str] = True
            if diff.removed and not yes:
                _show_diff(diff)
                remove = _confirm_removal(diff.source, diff.removed)
            diff = apply_file(app, path, remove=remove)
    except ChordbeatError as exc:
        raise click.ClickException(printable(exc)) from None
    if as_json:
        _echo_json({"dry_run": dry_run, **diff.as_json()})
        return
    _show_diff(diff)
    click.echo(printable(f"{'would change' if dry_run else 'applied'} (source {diff.source}): {diff.summary()}"))


def _show_diff(diff: Any) -> None:
    for label, names, style in (("+", diff.added, "green"), ("~", diff.changed, "yellow"), ("-", diff.removed, "red")):
        for name in names:
            fields = diff.fields.get(name)
            console.print(text_of(f"{label} {name}" + (f" ({', '.join(fields)})" if fields else ""), style))
    for name, owner in diff.taken_over.items():
        console.print(text_of(f"! {name}: taken over from {owner}", "yellow"))


def _confirm_removal(source: str, names: list[str]) -> list[str]:
    """The names the operator agreed to remove; refuses (nothing changed) otherwise."""
    question = f"remove {len(names)} schedule(s) of source {source} that the file no longer names?"
    try:
        if click.confirm(printable(question), default=False, err=True):
            return names
    except click.Abort:  # no terminal to ask in (end of input)
        pass
    raise click.ClickException(
        printable(f"nothing applied: removing {', '.join(names)} needs confirmation (or --prune)")
    )


def _zones(names: Iterable[str]) -> dict[str, ZoneInfo]:
    from celeryapp.interfaces.listing import zones_of

    with _connected() as client:
        return zones_of(client, set(names))


@main.command("list")
@json_option
def list_cmd(as_json: bool) -> None:
    """List schedules."""
    from celeryapp.client import each_schedule
    from celeryapp.interfaces.display import zone_of
    from celeryapp.interfaces.listing import SCHEDULE_PAGE

    with _connected() as client:
        schedules: list[dict[str, Any]] = [dict(s) for s in each_schedule(client, SCHEDULE_PAGE)]
    if as_json:
        _echo_json(schedules)
        return
    now = _now()
    table = new_table("name", "cadence", "status", "runs", "next run")
    for s in schedules:
        state = state_text(s["status"])
        if s["error_count"]:
            state.append(f"\n{s['error_count']} failed", style="red")
        next_run = time_cell(s["next_run_at"], zone_of(s["timezone"]), now)
        table.add_row(text_of(s["name"]), text_of(cadence_text(s)), state, text_of(s["run_count"]), next_run)
    console.print(table)


@main.command("show")
@click.argument("name")
@json_option
def show_cmd(name: str, as_json: bool) -> None:
    """A schedule: definition, status, next fire times, recent executions and slots (--json: all of it)."""
    from celeryapp.interfaces.display import took, upcoming, zone_of

    schedule = _call("get_schedule", name)
    executions = _call("list_executions", schedule=name, limit=5)
    slots = _call("list_slots", name, limit=5)
    if as_json:
        _echo_json(
            {
                "schedule": schedule,
                "next": [t.isoformat() for t in upcoming(schedule, 5)],
                "executions": executions,
                "slots": slots,
            }
        )
        return
    now = _now()
    zone = zone_of(schedule["timezone"])
    console.print(Text.assemble(text_of(name, "bold"), " ", state_text(schedule["status"])))
    console.print(
        text_of(
            f"  {cadence_text(schedule).replace(chr(10), ' ')}, overlap {schedule['overlap']}; runs "
            f"{schedule['run_count']}, failed {schedule['error_count']}, retry {schedule['current_retry']}"
        )
    )
    if schedule["last_error"]:
        console.print(Text("last error: "), text_of(schedule["last_error"], "red"), sep="")
    console.print(definition_table(schedule))
    from celeryapp.interfaces.display import when

    console.print(Text("next runs", style="italic"))
    for t in upcoming(schedule, 3):
        console.print(text_of(f"  {when(t, zone, now)}"))
    if schedule["next_run_at"] is None:
        console.print(text_of(f"  none ({schedule['status']})"))
    table = new_table("id", "trigger", "status", "started", "took", title="recent executions")
    for e in executions:
        started = time_cell(e["started_at"], zone, now)
        table.add_row(
            text_of(e["id"]),
            text_of(e["trigger"]),
            state_text(e["status"]),
            started,
            text_of(took(e["started_at"], e["completed_at"], now)),
        )
    console.print(table)
    _print_errors(executions)
    table = new_table("slot", "trigger", "outcome", "execution", title="recent slots")
    for slot in slots:
        outcome = text_of(slot["outcome"] + (f"\n{slot['detail']}" if slot["detail"] else ""))
        row = (
            time_cell(slot["nominal_at"], zone, now),
            text_of(slot["trigger"]),
            outcome,
            text_of(slot["execution_id"] or "-"),
        )
        table.add_row(*row)
    console.print(table)
    console.print(Text("full definition and records: --json", style="dim"))


def _print_errors(executions: list[dict[str, Any]]) -> None:
    for e in executions:
        if e["error"]:
            console.print(text_of(f"{e['id']}: ", "bold"), text_of(e["error"], "red"), sep="")


@main.command("next")
@click.argument("name")
@click.option("-n", "count", default=10, show_default=True, type=click.IntRange(1, 1000))
@json_option
def next_cmd(name: str, count: int, as_json: bool) -> None:
    """The coming fire times, in the schedule's zone with their UTC offsets."""
    from celeryapp.interfaces.display import upcoming, when, zone_of

    schedule = _call("get_schedule", name)
    times = upcoming(schedule, count)
    if as_json:
        _echo_json([t.isoformat() for t in times])
        return
    now = _now()
    for t in times:
        click.echo(printable(when(t, zone_of(schedule["timezone"]), now)))


def _watch(execution_id: int) -> dict[str, Any]:
    """Live view until the run ends: a progress bar per step group and each step's state."""
    from rich.live import Live
    from rich.progress import BarColumn, Progress, Task, TextColumn
    from rich.progress_bar import ProgressBar

    from celeryapp.interfaces.display import step_states, zone_of

    class Bar(BarColumn):  # type: ignore[misc]
        def render(self, task: Task) -> ProgressBar:
            style = task.fields.get("bar_style", "green")
            return ProgressBar(
                total=max(0, task.total or 0),
                completed=max(0, task.completed),
                width=self.bar_width,
                pulse=not task.started,
                animation_time=task.get_time(),
                style=self.style,
                complete_style=style,
                finished_style=style,
                pulse_style=self.pulse_style,
            )

    client = _client()
    try:
        first: dict[str, Any] = client.get_execution(execution_id)
        try:
            zone = zone_of(client.get_schedule(first["schedule"])["timezone"])
        except Exception:  # the schedule was deleted since: times in UTC
            zone = zone_of("UTC")
        sizes: dict[int, int] = {}
        for group, _step in step_states(first):
            sizes[group] = sizes.get(group, 0) + 1
        progress = Progress(
            TextColumn("group {task.fields[number]}"), Bar(bar_width=30), TextColumn("{task.completed}/{task.total}")
        )
        bars = {g: progress.add_task("", total=n, number=g + 1, bar_style="green") for g, n in sorted(sizes.items())}
        with Live(progress, console=console, refresh_per_second=8, transient=False) as live:
            while True:
                execution: dict[str, Any] = client.get_execution(execution_id)
                states = step_states(execution)
                for group, bar in bars.items():
                    mine = [state for (g, _s), (state, _a) in states.items() if g == group]
                    done = sum(1 for state in mine if state in FINISHED_STEP)
                    progress.update(bar, completed=done, bar_style=bar_style(mine))
                live.update(Group(progress, execution_view(execution, zone, _now())))
                if execution["status"] != "in_progress":
                    return execution
                time.sleep(0.25)
    finally:
        client.close()


def _watch_or_explain(execution_id: int) -> dict[str, Any]:
    """:func:`_watch`; Ctrl-C stops watching only, and says so: the run goes on."""
    try:
        return _watch(execution_id)
    except KeyboardInterrupt:
        console.print(
            text_of(
                f"stopped watching; execution {execution_id} goes on.\n"
                f"  watch again: chordbeat execution {execution_id} --watch\n"
                f"  cancel it:   chordbeat cancel {execution_id}",
                "yellow",
            )
        )
        sys.exit(130)


@main.command("run")
@click.argument("name")
@click.option("--payload", default=None, help="JSON object merged into the schedule's payload.")
@click.option("--wait", is_flag=True, help="Show live progress; exit 0 only if the run completes.")
@json_option
def run_cmd(name: str, payload: str | None, wait: bool, as_json: bool) -> None:
    """Start a run now."""
    try:
        data = json.loads(payload) if payload else None
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--payload") from None
    started = _call("trigger_schedule", name, payload=data)
    if started.get("execution_id") is None:
        if as_json:
            _echo_json(started)
        raise click.ClickException(printable(f"not started: {started['skipped']}"))
    if not wait:
        _echo_json(started) if as_json else click.echo(f"execution {started['execution_id']} started")
        return
    execution = _watch_or_explain(started["execution_id"]) if not as_json else _wait_quietly(started["execution_id"])
    if as_json:
        _echo_json(execution)
    sys.exit(0 if execution["status"] == "completed" else 1)


def _wait_quietly(execution_id: int) -> dict[str, Any]:
    while True:
        execution: dict[str, Any] = _call("get_execution", execution_id)
        if execution["status"] != "in_progress":
            return execution
        time.sleep(0.25)


@main.command("execution")
@click.argument("execution_id", type=int)
@click.option("--watch", is_flag=True, help="Follow it live until it ends; exit 0 only if it completes.")
@json_option
def execution_cmd(execution_id: int, watch: bool, as_json: bool) -> None:
    """One execution: its steps, states, times, errors and warnings."""
    from celeryapp.interfaces.display import zone_of

    execution = _call("get_execution", execution_id)
    if as_json and not watch:
        _echo_json(execution)
        return
    if watch:
        execution = _wait_quietly(execution_id) if as_json else _watch_or_explain(execution_id)
        if as_json:
            _echo_json(execution)
        sys.exit(0 if execution["status"] == "completed" else 1)
    zone = _zones([execution["schedule"]]).get(execution["schedule"], zone_of("UTC"))
    console.print(execution_view(execution, zone, _now()))


@main.command("executions")
@click.option("--schedule", default=None)
@click.option("--status", default=None)
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 500))
@click.option("--before", "before_id", default=None, type=click.IntRange(1), help="Only executions older than this id.")
@json_option
def executions_cmd(schedule: str | None, status: str | None, limit: int, before_id: int | None, as_json: bool) -> None:
    """Recent executions, newest first, a page at a time."""
    from celeryapp.interfaces.display import parse_time, took, zone_of
    from celeryapp.interfaces.listing import next_page_hint

    executions = _call("list_executions", schedule=schedule, status=status, limit=limit, before_id=before_id)
    if as_json:
        _echo_json(executions)
        return
    zones = _zones(e["schedule"] for e in executions)
    now = _now()
    table = new_table("id", "schedule", "status", "started", "took")
    for e in executions:
        zone = zones.get(e["schedule"], zone_of("UTC"))
        state = state_text(e["status"])
        if e["status"] == "in_progress":
            state.append(f"\ngroup {e['current_step_index'] + 1}", style="dim")
        else:
            state.append(f"\n{e['trigger']}", style="dim")
        duration = Text(took(e["started_at"], e["completed_at"], now))
        finished = parse_time(e["completed_at"])
        if finished is not None:
            duration.append(f"\nto {finished.astimezone(zone):%H:%M:%S}", style="dim")
        table.add_row(text_of(e["id"]), text_of(e["schedule"]), state, time_cell(e["started_at"], zone, now), duration)
    console.print(table)
    _print_errors(executions)
    if hint := next_page_hint(len(executions), limit, executions[-1]["id"] if executions else 0, schedule, status):
        console.print(text_of(hint, "dim"))


@main.command("cancel")
@click.argument("execution_id", type=int)
@json_option
def cancel_cmd(execution_id: int, as_json: bool) -> None:
    """Cancel a running execution."""
    execution = _call("cancel_execution", execution_id)
    _echo_json(execution) if as_json else click.echo(printable(f"execution {execution_id}: {execution['status']}"))


@main.command("pause")
@click.argument("name")
@json_option
def pause_cmd(name: str, as_json: bool) -> None:
    """Pause a schedule (runs already on their way do nothing)."""
    schedule = _call("pause_schedule", name)
    _echo_json(schedule) if as_json else click.echo(printable(f"{name}: {schedule['status']}"))


@main.command("resume")
@click.argument("name")
@json_option
def resume_cmd(name: str, as_json: bool) -> None:
    """Resume a paused schedule from its next slot (no make-up runs)."""
    from celeryapp.interfaces.display import when, zone_of

    schedule = _call("resume_schedule", name)
    if as_json:
        _echo_json(schedule)
        return
    next_at = when(schedule["next_run_at"], zone_of(schedule["timezone"]), _now())
    click.echo(printable(f"{name}: {schedule['status']}, next {next_at}"))


@main.command("health")
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


@main.command("metrics")
@click.option("--port", default=9808, show_default=True, type=int)
@click.option("--address", default="127.0.0.1", show_default=True, help="Interface to listen on.")
def metrics_cmd(port: int, address: str) -> None:
    """Serve Prometheus metrics about executions on /metrics."""
    from celeryapp.monitoring.metrics import serve

    click.echo(f"serving metrics on http://{address}:{port}/metrics")
    serve(_app(), port, address)


@main.command("web")
def web_cmd() -> None:
    """Serve the dashboard (CHORDBEAT_WEB_* settings; refuses to start without accounts)."""
    from celeryapp.interfaces.web.auth import check_auth_config
    from celeryapp.interfaces.web.server import serve

    app = _app()
    try:
        check_auth_config(app.settings.web_users, app.settings.web_secret)
    except ChordbeatError as exc:
        raise click.ClickException(printable(exc)) from None
    click.echo(f"dashboard on http://{app.settings.web_address}:{app.settings.web_port}/")
    serve(app)


@main.command("web-password")
@click.password_option()
def web_password_cmd(password: str) -> None:
    """Print a hash of a password for CHORDBEAT_WEB_USERS."""
    from celeryapp.interfaces.web.auth import hash_password

    click.echo(hash_password(password))
