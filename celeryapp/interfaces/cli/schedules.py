"""Commands about schedules: ``list``, ``show``, ``next``, ``pause`` and ``resume``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import click
from rich.text import Text

from celeryapp.interfaces.cli.calls import (
    call,
    connected,
    console,
    echo_json,
    json_option,
    print_errors,
    reference_now,
)
from celeryapp.interfaces.terminal import (
    cadence_text,
    definition_table,
    new_table,
    printable,
    state_text,
    text_of,
    time_cell,
)


def _upcoming(schedule: dict[str, Any], count: int) -> list[datetime]:
    """The schedule's next ``count`` fire times, in its own time zone."""
    from celeryapp.domain.times import fire_times, parse_time, zone_of

    first, zone = parse_time(schedule.get("next_run_at")), zone_of(schedule["timezone"])
    return fire_times(first, cron=schedule.get("cron"), every_s=schedule.get("every"), zone=zone, count=count)


@click.command("list")
@json_option
def list_cmd(as_json: bool) -> None:
    """List schedules."""
    from celeryapp.client import each_schedule
    from celeryapp.domain.times import zone_of
    from celeryapp.interfaces.listing import SCHEDULE_PAGE

    with connected() as client:
        schedules: list[dict[str, Any]] = [dict(s) for s in each_schedule(client, SCHEDULE_PAGE)]
    if as_json:
        echo_json(schedules)
        return
    now = reference_now()
    table = new_table("name", "cadence", "status", "runs", "next run")
    for s in schedules:
        state = state_text(s["status"])
        if s["error_count"]:
            state.append(f"\n{s['error_count']} failed", style="red")
        next_run = time_cell(s["next_run_at"], zone_of(s["timezone"]), now)
        table.add_row(text_of(s["name"]), text_of(cadence_text(s)), state, text_of(s["run_count"]), next_run)
    console.print(table)


@click.command("show")
@click.argument("name")
@json_option
def show_cmd(name: str, as_json: bool) -> None:
    """A schedule: definition, status, next fire times, recent executions and slots (--json: all of it)."""
    from celeryapp.domain.times import took, zone_of

    schedule = call("get_schedule", name)
    executions = call("list_executions", schedule=name, limit=5)
    slots = call("list_slots", name, limit=5)
    if as_json:
        echo_json(
            {
                "schedule": schedule,
                "next": [t.isoformat() for t in _upcoming(schedule, 5)],
                "executions": executions,
                "slots": slots,
            }
        )
        return
    now = reference_now()
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
    from celeryapp.domain.times import when

    console.print(Text("next runs", style="italic"))
    for t in _upcoming(schedule, 3):
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
    print_errors(executions)
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


@click.command("next")
@click.argument("name")
@click.option("-n", "count", default=10, show_default=True, type=click.IntRange(1, 1000))
@json_option
def next_cmd(name: str, count: int, as_json: bool) -> None:
    """The coming fire times, in the schedule's zone with their UTC offsets."""
    from celeryapp.domain.times import when, zone_of

    schedule = call("get_schedule", name)
    times = _upcoming(schedule, count)
    if as_json:
        echo_json([t.isoformat() for t in times])
        return
    now = reference_now()
    for t in times:
        click.echo(printable(when(t, zone_of(schedule["timezone"]), now)))


@click.command("pause")
@click.argument("name")
@json_option
def pause_cmd(name: str, as_json: bool) -> None:
    """Pause a schedule (runs already on their way do nothing)."""
    schedule = call("pause_schedule", name)
    echo_json(schedule) if as_json else click.echo(printable(f"{name}: {schedule['status']}"))


@click.command("resume")
@click.argument("name")
@json_option
def resume_cmd(name: str, as_json: bool) -> None:
    """Resume a paused schedule from its next slot (no make-up runs)."""
    from celeryapp.domain.times import when, zone_of

    schedule = call("resume_schedule", name)
    if as_json:
        echo_json(schedule)
        return
    next_at = when(schedule["next_run_at"], zone_of(schedule["timezone"]), reference_now())
    click.echo(printable(f"{name}: {schedule['status']}, next {next_at}"))
