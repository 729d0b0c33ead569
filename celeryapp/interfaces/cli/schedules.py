"""Commands about schedules: ``list``, ``show``, ``next``, ``pause`` (after asking), ``resume``
and ``delete`` (after asking)."""

from __future__ import annotations

import textwrap
from datetime import datetime, tzinfo
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from celeryapp.interfaces.cli.calls import (
    acting,
    acts,
    ask_reason,
    call,
    confirm,
    connected,
    console,
    echo_json,
    json_option,
    print_errors,
    reference_now,
    viewer_zone,
    yes_option,
    zone_title,
)
from celeryapp.interfaces.terminal import (
    TIME_WIDTH,
    alerting_lines,
    cadence_text,
    definition_table,
    hanging,
    new_table,
    printable,
    run_text,
    state_text,
    text_of,
    time_cell,
)

#: Columns a slot's reason and DST note of ``chordbeat next`` are wrapped to.
NOTE_WIDTH = 80


def _upcoming(schedule: dict[str, Any], count: int) -> list[datetime]:
    """The schedule's next ``count`` fire times, in its own time zone."""
    from celeryapp.domain.cadence import fire_times
    from celeryapp.domain.dst_rules import DstRules
    from celeryapp.domain.times import parse_time
    from celeryapp.interfaces.time_words import zone_of

    first, zone = parse_time(schedule.get("next_run_at")), zone_of(schedule["timezone"])
    cron, every_s, dst = schedule.get("cron"), schedule.get("every"), DstRules.from_json(schedule.get("dst"))
    return fire_times(first, cron=cron, every_s=every_s, zone=zone, count=count, dst=dst)


def _exclusions(schedule: dict[str, Any], times: list[datetime]) -> list[str | None]:
    """Why each of ``times`` will not run (its business calendar excludes its day), or ``None``."""
    if not schedule.get("calendar") or not times:
        return [None] * len(times)
    from celeryapp.domain.times import parse_time
    from celeryapp.interfaces.next_fires import MAX_NEXT_FIRES

    if len(times) > MAX_NEXT_FIRES:
        # Past the preview's bound no slot's exclusion is known: refused rather than shown as running.
        raise click.BadParameter(
            f"at most {MAX_NEXT_FIRES} for a schedule with a business calendar (got {len(times)})", param_hint="-n"
        )
    # Named calendars are files on the workers' hosts: the workers say which slots they exclude.
    fires = call("next_fires", schedule["name"], count=len(times))
    excluded = {parse_time(fire["at"]): fire["excluded"] for fire in fires}
    return [excluded.get(t) for t in times]


def _marked(line: str, reason: str | None) -> str:
    return f"{line}  not run: {reason}" if reason else line


#: A slot record's note for a due time before the schedule was created (a backfill of history);
#: short, as it wraps within the outcome column of `show`'s 80-column table.
BEFORE_SCHEDULE = "before it existed"


def _dst_notes(schedule: dict[str, Any], times: list[datetime], now: datetime) -> list[str | None]:
    """What the schedule's DST rule does to each of ``times`` on a day the clocks change."""
    from celeryapp.domain.dst_rules import DstRules
    from celeryapp.interfaces.dst_notes import dst_notes
    from celeryapp.interfaces.time_words import zone_of

    zone = zone_of(schedule["timezone"])
    return dst_notes(schedule.get("cron"), zone, DstRules.from_json(schedule.get("dst")), now, times)


@click.command("list")
@json_option
def list_cmd(as_json: bool) -> None:
    """List schedules (next runs in your zone: TZ, else this host's)."""
    from celeryapp.client import each_schedule
    from celeryapp.interfaces.listing import SCHEDULE_PAGE

    with connected() as client:
        schedules: list[dict[str, Any]] = [dict(s) for s in each_schedule(client, SCHEDULE_PAGE)]
    if as_json:
        echo_json(schedules)
        return
    now, viewer = reference_now(), viewer_zone()
    # Rows of many schedules: every next run in the viewer's zone, named in the title (each
    # schedule's own zone is in its cadence). No run count: "runs" is counted over a schedule's
    # executions (interfaces/run_counts.py), which `show` does for one schedule, not a list for all.
    table = new_table("name", "cadence", "status")
    table.add_column(f"next run ({zone_title(viewer, now)})", min_width=TIME_WIDTH)
    for s in schedules:
        next_run = time_cell(s["next_run_at"], viewer, None, now)
        table.add_row(text_of(s["name"]), text_of(cadence_text(s)), state_text(s["status"]), next_run)
    console.print(table)


@click.command("show")
@click.argument("name")
@json_option
def show_cmd(name: str, as_json: bool) -> None:
    """A schedule: definition, status, next fire times, recent executions and slots (--json: all of it)."""
    from celeryapp.interfaces.cron_words import describe
    from celeryapp.interfaces.run_counts import RunCounts
    from celeryapp.interfaces.time_words import stamp, time_control_words, took, zone_of

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
    now, viewer = reference_now(), viewer_zone()
    zone = zone_of(schedule["timezone"])
    console.print(Text.assemble(text_of(name, "bold"), " ", state_text(schedule["status"])))
    if schedule["status"] == "paused" and schedule.get("paused_by"):
        since = stamp(schedule.get("paused_at"), zone, viewer, now)
        why = f": {schedule['paused_reason']}" if schedule.get("paused_reason") else ""
        console.print(hanging(text_of(f"  paused by {schedule['paused_by']} since {since}{why}", "yellow")))
    console.print(hanging(text_of(f"  {cadence_text(schedule).replace(chr(10), ' ')}, overlap {schedule['overlap']}")))
    if schedule.get("cron"):
        # A daily wall time of the schedule's zone, not an instant: the zone is named, as in `next`.
        console.print(hanging(text_of(f"  {describe(schedule['cron'])}, {schedule['timezone']} time")))
    for words in time_control_words(schedule):  # catch-up, calendar and DST, the defaults said too
        console.print(hanging(text_of(f"  {words}")))
    # The dashboard's words for the same count (one definition: interfaces/run_counts.py).
    counts = RunCounts.from_json(schedule.get("runs") or {}).words()
    console.print(hanging(text_of(f"  {counts} · retry {schedule['current_retry']}")))
    for line in alerting_lines(schedule, zone, viewer, now):
        console.print(line)
    if schedule["last_error"]:
        console.print(hanging(Text("last error: "), text_of(schedule["last_error"], "red")))
    console.print(definition_table(schedule))
    console.print(Text("next runs", style="italic"))
    upcoming = _upcoming(schedule, 3)
    notes = _dst_notes(schedule, upcoming, now)
    for t, reason, note in zip(upcoming, _exclusions(schedule, upcoming), notes, strict=True):
        console.print(hanging(text_of(_marked(f"  {stamp(t, zone, viewer, now)}", reason))))
        if note:
            console.print(hanging(text_of(f"    {note}", "dim")))
    if schedule["next_run_at"] is None:
        console.print(text_of(f"  none ({schedule['status']})"))
    table = new_table("id", "trigger", title="recent executions")
    table.add_column("status", no_wrap=True)  # "completed with warnings" reads as one
    table.add_column("started", min_width=TIME_WIDTH)
    table.add_column("took")
    for e in executions:
        started = time_cell(e["started_at"], zone, viewer, now)
        table.add_row(
            text_of(e["id"]),
            text_of(e["trigger"]),
            run_text(e),
            started,
            text_of(took(e["started_at"], e["completed_at"], now)),
        )
    console.print(table)
    print_errors(executions)
    console.print(_slots_table(slots, zone, viewer, now))
    console.print(Text("full definition and records: --json", style="dim"))


@click.command("next")
@click.argument("name")
@click.option("-n", "count", default=10, show_default=True, type=click.IntRange(1, 1000))
@json_option
def next_cmd(name: str, count: int, as_json: bool) -> None:
    """The coming fire times, in the schedule's zone with their UTC offsets (and yours beside them);
    those its business calendar excludes say why they will not run."""
    from celeryapp.domain.times import iso
    from celeryapp.interfaces.cron_words import describe
    from celeryapp.interfaces.time_words import stamp, zone_of

    schedule = call("get_schedule", name)
    times = _upcoming(schedule, count)
    reasons = _exclusions(schedule, times)
    now = reference_now()
    notes = _dst_notes(schedule, times, now)
    if as_json:
        # chordbeat.next_fires' objects: the slot in UTC, on the schedule's wall clock, why not run,
        # what the DST rule did to it, and the definition version its run would run.
        fires = zip(times, reasons, notes, strict=True)
        version = schedule.get("version")
        echo_json(
            [{"at": iso(t), "local": t.isoformat(), "excluded": r, "dst": n, "version": version} for t, r, n in fires]
        )
        return
    viewer = viewer_zone()
    if schedule.get("cron"):
        click.echo(printable(f"{describe(schedule['cron'])}, {schedule['timezone']} time:"))
    for t, reason, note in zip(times, reasons, notes, strict=True):
        # A slot's reason wraps under it, within the 80 columns the output keeps to.
        line = _marked(stamp(t, zone_of(schedule["timezone"]), viewer, now), reason)
        click.echo(printable(textwrap.fill(line, NOTE_WIDTH, subsequent_indent="    ") if reason else line))
        if note:
            # Under its slot, wrapped to the 80 columns the output keeps to.
            click.echo(printable(textwrap.fill(note, NOTE_WIDTH, initial_indent="  ", subsequent_indent="    ")))


@click.command("pause")
@click.argument("name")
@yes_option
@acts
@json_option
def pause_cmd(name: str, yes: bool, as_name: str | None, reason: str | None, as_json: bool) -> None:
    """Pause a schedule (asks why, unless --reason, then asks first; runs already on their way do
    nothing)."""
    from celeryapp.domain.times import parse_time
    from celeryapp.interfaces.time_words import relative

    schedule = call("get_schedule", name)
    if schedule["status"] == "active":
        next_at = relative(parse_time(schedule["next_run_at"]), reference_now())
        if reason is None and not yes:
            # The dashboard requires a reason; a person at a terminal is asked for one here too.
            reason = ask_reason(f"why pause {name}?")
        because = f", because: {reason}" if reason else ""
        confirm(f"pause {name} (active, next run {next_at}){because}?", yes)
    schedule = call("pause_schedule", name, actor=acting(as_name), reason=reason)
    if as_json:
        echo_json(schedule)
    elif schedule.get("changed") is False:
        said = f" by {schedule['paused_by']}" if schedule.get("paused_by") else ""
        click.echo(printable(f"{name}: already paused{said}; nothing changed"))
    else:
        click.echo(printable(f"{name}: {schedule['status']}"))


@click.command("resume")
@click.argument("name")
@acts
@json_option
def resume_cmd(name: str, as_name: str | None, reason: str | None, as_json: bool) -> None:
    """Resume a paused schedule from its next slot (no make-up runs)."""
    from celeryapp.interfaces.time_words import stamp, zone_of

    schedule = call("resume_schedule", name, actor=acting(as_name), reason=reason)
    if as_json:
        echo_json(schedule)
        return
    next_at = stamp(schedule["next_run_at"], zone_of(schedule["timezone"]), viewer_zone(), reference_now())
    if schedule.get("changed") is False:
        click.echo(printable(f"{name}: already {schedule['status']}, next {next_at}; nothing changed"))
        return
    click.echo(printable(f"{name}: {schedule['status']}, next {next_at}"))


@click.command("delete")
@click.argument("name")
@yes_option
@acts
@json_option
def delete_cmd(name: str, yes: bool, as_name: str | None, reason: str | None, as_json: bool) -> None:
    """Delete a schedule (asks first; its runs' history is kept)."""
    schedule = call("get_schedule", name)
    steps = sum(len(g) if isinstance(g, list) else 1 for g in schedule["steps"])
    confirm(f"delete schedule {name} ({schedule['status']}, {steps} steps; its runs' history is kept)?", yes)
    deleted = call("delete_schedule", name, actor=acting(as_name), reason=reason)
    echo_json(deleted) if as_json else click.echo(printable(f"{name}: deleted"))


def _slots_table(slots: list[dict[str, Any]], zone: tzinfo, viewer: tzinfo, now: datetime) -> Table:
    """``show``'s slot record: each due time, what became of it, and why."""
    from celeryapp.interfaces.time_words import instants_in

    table = new_table("slot", "trigger", "outcome", "execution", title="recent slots")
    for slot in slots:
        outcome = state_text(slot["outcome"])
        if slot["detail"]:
            outcome.append_text(text_of(f"\n{instants_in(slot['detail'], zone)}", "dim"))
        if slot.get("before_schedule"):
            outcome.append_text(text_of(f"\n{BEFORE_SCHEDULE}", "dim"))
        row = (
            time_cell(slot["nominal_at"], zone, viewer, now),
            text_of(slot["trigger"]),
            outcome,
            text_of(slot["execution_id"] or "-"),
        )
        table.add_row(*row)
    return table
