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
import re
import sys
import time
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import click
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from celeryapp.errors import ChordbeatError

console = Console()

#: Characters that steer a terminal or reorder text (C0 and C1 controls but tab and newline, line
#: and paragraph separators, bidi controls). Names, errors and outputs are data: shown as escapes.
UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def printable(value: object) -> str:
    """``value`` as inert text: terminal controls and bidi overrides become visible escapes."""
    return UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(value))


def text_of(value: object, style: str = "") -> Text:
    """A table cell or line from data: a Text is never parsed for markup (``[/]``, ``[link=…]``)."""
    return Text(printable(value), style=style)


def _printable_json(value: Any) -> Any:
    if isinstance(value, dict):
        return {printable(k): _printable_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_printable_json(v) for v in value]
    return printable(value) if isinstance(value, str) else value


def _app() -> Any:
    from celeryapp import app

    app.loader.import_default_modules()
    return app


def _client() -> Any:
    from celeryapp.client import ChordbeatClient

    settings = _app().settings
    return ChordbeatClient(settings.broker_url, settings.result_backend)


def _call(method: str, *args: Any, **kwargs: Any) -> Any:
    client = _client()
    try:
        return getattr(client, method)(*args, **kwargs)
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
@json_option
def apply_cmd(path: str, dry_run: bool, as_json: bool) -> None:
    """Apply a declarative schedule file (file schedules override stored ones)."""
    from celeryapp.schedule_file import apply_file

    try:
        diff = apply_file(_app(), path, dry_run=dry_run)
    except ChordbeatError as exc:
        raise click.ClickException(printable(exc)) from None
    if as_json:
        _echo_json({"dry_run": dry_run, **diff.as_json()})
        return
    for label, names, style in (("+", diff.added, "green"), ("~", diff.changed, "yellow"), ("-", diff.removed, "red")):
        for name in names:
            console.print(text_of(f"{label} {name}", style))
    click.echo(printable(f"{'would change' if dry_run else 'applied'}: {diff.summary()}"))


def upcoming(schedule: dict[str, Any], count: int) -> list[datetime]:
    """The schedule's next fire times, in its own time zone."""
    from celeryapp.cron import CronExpression

    zone = ZoneInfo(schedule["timezone"])
    first = schedule.get("next_run_at")
    if first is None:
        return []
    start = datetime.fromisoformat(first.replace("Z", "+00:00"))
    if schedule.get("cron"):
        times = [start, *CronExpression.parse(schedule["cron"]).upcoming(start, zone, count - 1)]
    else:
        times = [start + timedelta(seconds=schedule["every"] * i) for i in range(count)]
    return [t.astimezone(zone) for t in times[:count]]


@main.command("list")
@json_option
def list_cmd(as_json: bool) -> None:
    """List schedules."""
    schedules = _call("list_schedules")
    if as_json:
        _echo_json(schedules)
        return
    table = Table("name", "when", "status", "runs", "errors", "next run")
    for s in schedules:
        when = f"cron {s['cron']} {s['timezone']}" if s.get("cron") else f"every {s['every']}s"
        row = (s["name"], when, s["status"], s["run_count"], s["error_count"], s["next_run_at"] or "-")
        table.add_row(*map(text_of, row))
    console.print(table)


@main.command("show")
@click.argument("name")
@json_option
def show_cmd(name: str, as_json: bool) -> None:
    """A schedule: definition, status, next fire times, recent executions and slots."""
    schedule = _call("get_schedule", name)
    executions = _call("list_executions", schedule=name, limit=10)
    slots = _call("list_slots", name, limit=10)
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
    console.print(
        text_of(name, "bold"),
        text_of(
            f" {schedule['status']}  runs {schedule['run_count']}, "
            f"errors {schedule['error_count']}, retry {schedule['current_retry']}"
        ),
    )
    if schedule["last_error"]:
        console.print(Text("last error: "), text_of(schedule["last_error"], "red"), sep="")
    shown = {k: schedule[k] for k in ("cron", "every", "timezone", "overlap", "steps") if k in schedule}
    console.print_json(json.dumps(_printable_json(shown)))
    console.print(text_of("next: " + (", ".join(t.isoformat() for t in upcoming(schedule, 5)) or "-")))
    table = Table("id", "trigger", "status", "started", "error", title="recent executions")
    for e in executions:
        table.add_row(*map(text_of, (e["id"], e["trigger"], e["status"], e["started_at"], e["error"] or "")))
    console.print(table)
    table = Table("nominal", "trigger", "outcome", "execution", "detail", title="recent slots")
    for s in slots:
        row = (s["nominal_at"] or "-", s["trigger"], s["outcome"], s["execution_id"] or "-", s["detail"] or "")
        table.add_row(*map(text_of, row))
    console.print(table)


@main.command("next")
@click.argument("name")
@click.option("-n", "count", default=10, show_default=True, type=click.IntRange(1, 1000))
@json_option
def next_cmd(name: str, count: int, as_json: bool) -> None:
    """The coming fire times, in the schedule's zone with their UTC offsets."""
    times = upcoming(_call("get_schedule", name), count)
    if as_json:
        _echo_json([t.isoformat() for t in times])
        return
    for t in times:
        click.echo(f"{t.isoformat()}  ({t.tzname()})")


def step_states(execution: dict[str, Any]) -> dict[tuple[int, str], tuple[str, int]]:
    """Each step's current state and attempt, in run order: its open task or its latest activity."""
    states: dict[tuple[int, str], tuple[str, int]] = {}
    for a in execution["activities"]:  # ordered by attempt within a step
        states[(a["step_index"], a["step"])] = (a["status"], a["attempt"])
    for t in execution["tasks"]:
        key = (t["step_index"], t["step"])
        running = states.get(key, ("", 0))
        # A processing task's running attempt already shows as its in-progress activity.
        if not (running[0] == "in_progress" and running[1] == t["attempt"]):
            states[key] = (t["status"], t["attempt"])
    return dict(sorted(states.items(), key=lambda item: item[0][0]))


def _group_table(states: dict[tuple[int, str], tuple[str, int]], title: str) -> Table:
    table = Table("group", "step", "state", "attempt", title=text_of(title))
    for (group, step), (state, attempt) in states.items():
        table.add_row(*map(text_of, (group, step, state, attempt)))
    return table


FINISHED_STEP = {"complete", "complete_with_warning", "complete_with_error", "failed_with_error", "cancelled"}


def _watch(execution_id: int) -> dict[str, Any]:
    """Live view until the run ends: a progress bar per step group and each step's state."""
    from rich.live import Live
    from rich.progress import BarColumn, Progress, TextColumn

    client = _client()
    try:
        first = step_states(client.get_execution(execution_id))
        sizes: dict[int, int] = {}
        for group, _step in first:
            sizes[group] = sizes.get(group, 0) + 1
        progress = Progress(
            TextColumn("group {task.fields[group]}"), BarColumn(), TextColumn("{task.completed}/{task.total}")
        )
        bars = {g: progress.add_task("", total=n, group=g) for g, n in sorted(sizes.items())}
        with Live(progress, console=console, refresh_per_second=8, transient=False) as live:
            while True:
                execution: dict[str, Any] = client.get_execution(execution_id)
                states = step_states(execution)
                for group, bar in bars.items():
                    done = sum(1 for (g, _s), (state, _a) in states.items() if g == group and state in FINISHED_STEP)
                    progress.update(bar, completed=done)
                title = f"execution {execution_id}: {execution['status']}"
                live.update(Group(progress, _group_table(states, title)))
                if execution["status"] != "in_progress":
                    return execution
                time.sleep(0.25)
    finally:
        client.close()


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
    execution = _watch(started["execution_id"]) if not as_json else _wait_quietly(started["execution_id"])
    if as_json:
        _echo_json(execution)
    elif execution["error"]:
        console.print(text_of(execution["error"], "red"))
    sys.exit(0 if execution["status"] == "completed" else 1)


def _wait_quietly(execution_id: int) -> dict[str, Any]:
    while True:
        execution: dict[str, Any] = _call("get_execution", execution_id)
        if execution["status"] != "in_progress":
            return execution
        time.sleep(0.25)


@main.command("executions")
@click.option("--schedule", default=None)
@click.option("--status", default=None)
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 1000))
@json_option
def executions_cmd(schedule: str | None, status: str | None, limit: int, as_json: bool) -> None:
    """Recent executions, newest first."""
    executions = _call("list_executions", schedule=schedule, status=status, limit=limit)
    if as_json:
        _echo_json(executions)
        return
    table = Table("id", "schedule", "trigger", "status", "step", "started", "error")
    for e in executions:
        row = (e["id"], e["schedule"], e["trigger"], e["status"], e["current_step_index"], e["started_at"])
        table.add_row(*map(text_of, (*row, e["error"] or "")))
    console.print(table)


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
    schedule = _call("resume_schedule", name)
    shown = f"{name}: {schedule['status']}, next {schedule['next_run_at']}"
    _echo_json(schedule) if as_json else click.echo(printable(shown))


@main.command("health")
@click.argument("process", type=click.Choice(["worker", "beat"]))
def health_cmd(process: str) -> None:
    """Exit non-zero when the process's liveness file is stale or missing (for healthchecks)."""
    from celeryapp.config import Settings
    from celeryapp.health import STALE_AFTER_S, age_s, problem

    settings = Settings.from_env()
    age = age_s(settings, process)
    limit = STALE_AFTER_S[process]
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
    from celeryapp.metrics import serve

    click.echo(f"serving metrics on http://{address}:{port}/metrics")
    serve(_app(), port, address)
