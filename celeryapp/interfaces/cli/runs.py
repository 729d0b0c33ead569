"""Commands about runs: ``run`` a schedule now, one ``execution``, the recent ``executions``, and
``cancel``."""

from __future__ import annotations

import json
import sys

import click
from rich.text import Text

from celeryapp.interfaces.cli.calls import (
    call,
    console,
    echo_json,
    json_option,
    print_errors,
    reference_now,
    zones_for,
)
from celeryapp.interfaces.cli.watch import wait_quietly, watch_or_explain
from celeryapp.interfaces.terminal import execution_view, new_table, printable, state_text, text_of, time_cell


@click.command("run")
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
    started = call("trigger_schedule", name, payload=data)
    if started.get("execution_id") is None:
        if as_json:
            echo_json(started)
        raise click.ClickException(printable(f"not started: {started['skipped']}"))
    if not wait:
        echo_json(started) if as_json else click.echo(f"execution {started['execution_id']} started")
        return
    execution = watch_or_explain(started["execution_id"]) if not as_json else wait_quietly(started["execution_id"])
    if as_json:
        echo_json(execution)
    sys.exit(0 if execution["status"] == "completed" else 1)


@click.command("execution")
@click.argument("execution_id", type=int)
@click.option("--watch", is_flag=True, help="Follow it live until it ends; exit 0 only if it completes.")
@json_option
def execution_cmd(execution_id: int, watch: bool, as_json: bool) -> None:
    """One execution: its steps, states, times, errors and warnings."""
    from celeryapp.domain.times import zone_of

    execution = call("get_execution", execution_id)
    if as_json and not watch:
        echo_json(execution)
        return
    if watch:
        execution = wait_quietly(execution_id) if as_json else watch_or_explain(execution_id)
        if as_json:
            echo_json(execution)
        sys.exit(0 if execution["status"] == "completed" else 1)
    zone = zones_for([execution["schedule"]]).get(execution["schedule"], zone_of("UTC"))
    console.print(execution_view(execution, zone, reference_now()))


@click.command("executions")
@click.option("--schedule", default=None)
@click.option("--status", default=None)
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 500))
@click.option("--before", "before_id", default=None, type=click.IntRange(1), help="Only executions older than this id.")
@json_option
def executions_cmd(schedule: str | None, status: str | None, limit: int, before_id: int | None, as_json: bool) -> None:
    """Recent executions, newest first, a page at a time."""
    from celeryapp.domain.times import parse_time, took, zone_of
    from celeryapp.interfaces.listing import next_page_hint

    executions = call("list_executions", schedule=schedule, status=status, limit=limit, before_id=before_id)
    if as_json:
        echo_json(executions)
        return
    zones = zones_for(e["schedule"] for e in executions)
    now = reference_now()
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
    print_errors(executions)
    if hint := next_page_hint(len(executions), limit, executions[-1]["id"] if executions else 0, schedule, status):
        console.print(text_of(hint, "dim"))


@click.command("cancel")
@click.argument("execution_id", type=int)
@json_option
def cancel_cmd(execution_id: int, as_json: bool) -> None:
    """Cancel a running execution."""
    execution = call("cancel_execution", execution_id)
    echo_json(execution) if as_json else click.echo(printable(f"execution {execution_id}: {execution['status']}"))
