"""Commands about runs: ``run`` a schedule now, one ``execution``, the recent ``executions``,
``cancel`` one (after asking), and ``rerun`` a failed one."""

from __future__ import annotations

import json
from typing import Any

import click

from celeryapp.interfaces.cli.calls import (
    acting,
    acts,
    call,
    confirm,
    console,
    echo_json,
    json_option,
    list_zone,
    print_errors,
    reference_now,
    viewer_zone,
    yes_option,
    zone_title,
    zones_for,
)
from celeryapp.interfaces.cli.watch import follow
from celeryapp.interfaces.terminal import TIME_WIDTH, new_table, printable, run_text, text_of, time_cell


def _payload_option(payload: str | None) -> Any:
    """``--payload``'s JSON (the service checks it is an object, and its size and depth)."""
    try:
        return json.loads(payload) if payload else None
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--payload") from None


@click.command("run")
@click.argument("name")
@click.option("--payload", default=None, help="JSON object merged into the schedule's payload.")
@click.option("--wait", is_flag=True, help="Show live progress; exit 0 only if the run completes.")
@acts
@json_option
def run_cmd(name: str, payload: str | None, wait: bool, as_name: str | None, reason: str | None, as_json: bool) -> None:
    """Start a run now."""
    data = _payload_option(payload)
    started = call("trigger_schedule", name, payload=data, actor=acting(as_name), reason=reason)
    if started.get("execution_id") is None:
        if as_json:
            echo_json(started)
        raise click.ClickException(printable(f"not started: {started['skipped']}"))
    if not wait:
        echo_json(started) if as_json else click.echo(f"execution {started['execution_id']} started")
        return
    follow(started["execution_id"], as_json)


@click.command("execution")
@click.argument("execution_id", type=int)
@click.option("--watch", is_flag=True, help="Follow it live until it ends; exit 0 only if it completes.")
@click.option("--full", is_flag=True, help="Every line of tracebacks and logs, not the last 20.")
@json_option
def execution_cmd(execution_id: int, watch: bool, full: bool, as_json: bool) -> None:
    """One execution: its steps, states, times, errors, warnings, outputs, tracebacks and logs."""
    from celeryapp.interfaces.run_view import execution_text
    from celeryapp.interfaces.time_words import zone_of

    execution = call("get_execution", execution_id)
    if watch:
        follow(execution_id, as_json)
    if as_json:
        echo_json(execution)
        return
    zone = zones_for([execution["schedule"]]).get(execution["schedule"], zone_of("UTC"))
    console.print(execution_text(execution, zone, viewer_zone(), reference_now(), evidence=True, full=full))


@click.command("executions")
@click.option("--schedule", default=None)
@click.option("--status", default=None)
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 500))
@click.option("--before", "before_id", default=None, type=click.IntRange(1), help="Only executions older than this id.")
@click.option(
    "--version", default=None, type=click.IntRange(1), help="Only runs of this definition version (--schedule)."
)
@json_option
def executions_cmd(
    schedule: str | None, status: str | None, limit: int, before_id: int | None, version: int | None, as_json: bool
) -> None:
    """Recent executions, newest first, a page at a time."""
    from celeryapp.interfaces.listing import next_page_hint
    from celeryapp.interfaces.time_words import took

    executions = call(
        "list_executions", schedule=schedule, status=status, limit=limit, before_id=before_id, version=version
    )
    if as_json:
        echo_json(executions)
        return
    now = reference_now()
    zone, viewer = list_zone({e["schedule"] for e in executions})
    table = new_table("id", "schedule")
    table.add_column("status", no_wrap=True)  # "completed with warnings" reads as one
    table.add_column(f"started ({zone_title(zone, now)})", min_width=TIME_WIDTH)
    table.add_column("took")
    for e in executions:
        state = run_text(e)
        if e["status"] == "in_progress":
            state.append(f"\ngroup {e['current_step_index'] + 1}", style="dim")
        else:
            state.append(f"\n{e['trigger']}", style="dim")
        duration = text_of(took(e["started_at"], e["completed_at"], now))
        table.add_row(
            text_of(e["id"]), text_of(e["schedule"]), state, time_cell(e["started_at"], zone, viewer, now), duration
        )
    console.print(table)
    print_errors(executions)
    last = executions[-1]["id"] if executions else 0
    if hint := next_page_hint(len(executions), limit, last, schedule, status, version):
        console.print(text_of(hint, "dim"))


@click.command("cancel")
@click.argument("execution_id", type=int)
@yes_option
@acts
@json_option
def cancel_cmd(execution_id: int, yes: bool, as_name: str | None, reason: str | None, as_json: bool) -> None:
    """Cancel a running execution (asks first; --yes does not)."""
    from celeryapp.domain.times import parse_time, span

    execution = call("get_execution", execution_id)
    if execution["status"] != "in_progress":
        said = f"execution {execution_id} of {execution['schedule']}: already {run_text(execution)}; nothing to cancel"
        echo_json(execution) if as_json else click.echo(printable(said))
        return
    started = parse_time(execution["started_at"])
    running = span((reference_now() - started).total_seconds()) if started else "-"
    confirm(f"cancel execution {execution_id} of {execution['schedule']} (running {running})?", yes)
    execution = call("cancel_execution", execution_id, actor=acting(as_name), reason=reason)
    if as_json:
        echo_json(execution)
        return
    console.print(text_of(f"execution {execution_id}: "), run_text(execution), sep="")
    if execution["error"]:
        console.print(text_of(f"  {execution['error']}", "dim"))


@click.command("rerun")
@click.argument("execution_id", type=int)
@click.option("--from-failed", is_flag=True, help="Start at the group that failed (earlier groups are taken as done).")
@click.option(
    "--payload", default=None, help="JSON object run instead of the execution's own payload (whole, not merged)."
)
@click.option("--wait", is_flag=True, help="Show live progress; exit 0 only if the run completes.")
@click.option("--latest", is_flag=True, help="Run the current definition, not the run's own version.")
@acts
@json_option
def rerun_cmd(
    execution_id: int,
    from_failed: bool,
    payload: str | None,
    wait: bool,
    latest: bool,
    as_name: str | None,
    reason: str | None,
    as_json: bool,
) -> None:
    """Run a failed or cancelled execution again: a new manual run with its slot and payload
    (or --payload) and its definition version's steps (or --latest: the current definition's)."""
    from celeryapp.interfaces.run_view import rerun_group

    data = _payload_option(payload)
    changed: dict[str, Any] = {} if data is None else {"payload": data}
    if latest:
        changed["latest"] = True
    started: dict[str, Any] = call(
        "rerun_execution", execution_id, from_failed=from_failed, actor=acting(as_name), reason=reason, **changed
    )
    if started.get("id") is None:  # the overlap policy started nothing
        if as_json:
            echo_json(started)
        raise click.ClickException(printable(f"not started: {started['skipped']}"))
    if not wait:
        if as_json:
            echo_json(started)
            return
        said = f"execution {started['id']} started: re-run of {execution_id} from group {rerun_group(started)}"
        if data is not None:
            said += f" with payload {json.dumps(started['payload'])}"
        if latest:
            said += f" (latest: version {started['version']})"
        click.echo(printable(said))
        return
    follow(started["id"], as_json)
