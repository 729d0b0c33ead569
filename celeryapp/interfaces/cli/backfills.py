"""Commands about backfills: ``backfill NAME --from --to`` lists a range of past slots and, after
asking, runs them (``--dry-run`` only lists); ``backfill --cancel ID`` stops what has not started
(after asking); ``backfills NAME`` shows a schedule's backfills and catch-ups with their progress."""

from __future__ import annotations

import sys
import time
from datetime import datetime, tzinfo
from typing import Any

import click

from celeryapp.domain.limits import short_repr
from celeryapp.interfaces.cli.calls import (
    acting,
    acts,
    call,
    confirm,
    console,
    echo_json,
    json_option,
    reference_now,
    viewer_zone,
    yes_option,
)
from celeryapp.interfaces.terminal import hanging, printable, text_of

#: Slots a list shows before it says how many more there are (``--json`` gives them all).
SLOTS_SHOWN = 10
#: Backfills ``chordbeat backfills`` shows at most.
BACKFILLS_SHOWN = 20
#: How often ``--wait`` asks how far a backfill got.
WAIT_POLL_S = 0.5


#: The service's names of the range's ends, and the flags a person typed them with.
FLAGS = {"start": "--from", "end": "--to"}


def time_arg(text: str, zone: tzinfo, flag: str) -> str:
    """``--from``/``--to`` as the service takes them: ISO 8601 with its offset; a date or time that
    names no offset is the schedule's wall time (``zone``), as on the dashboard's form: a backfill
    runs the schedule's slots, which are its zone's times (docs/schedules.md, Backfill)."""
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(
            f"not a date or time: {short_repr(text)} (2026-11-20, 2026-11-20 02:00 (24-hour), or ISO 8601 "
            "with an offset)",
            param_hint=flag,
        ) from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=zone)).isoformat()


def _flagged(method: str, *args: Any, **kwargs: Any) -> Any:
    """A backfill call whose refusal of ``start`` or ``end`` names the flag they came from."""
    try:
        return call(method, *args, **kwargs)
    except click.ClickException as exc:
        field, _, said = exc.message.partition(": ")
        if field in FLAGS and said:
            # The service's words for the range's ends, as they were typed here.
            said = said.replace("start ≤ slot < end", "--from ≤ slot < --to").replace(" start ", " --from ")
            raise click.BadParameter(said, param_hint=FLAGS[field]) from None
        raise


def _slot_lines(slots: list[str], zone: tzinfo, viewer: tzinfo, now: datetime) -> None:
    from celeryapp.interfaces.time_words import stamp

    for slot in slots[:SLOTS_SHOWN]:
        console.print(hanging(text_of(f"  {stamp(slot, zone, viewer, now)}")))
    if len(slots) > SLOTS_SHOWN:
        console.print(text_of(f"  … and {len(slots) - SLOTS_SHOWN} more (--json lists them all)", "dim"))


def _say_slots(
    name: str, answer: dict[str, Any], mode: str, zone: tzinfo, viewer: tzinfo, now: datetime, request: dict[str, Any]
) -> None:
    """How many slots, the first and the last, and the list (shortened when long); with none, why."""
    from celeryapp.interfaces.time_words import stamp

    count, slots = answer["count"], answer["slots"]
    console.print(text_of(f"{name}: {count} slot{'' if count == 1 else 's'} to backfill (mode {mode})", "bold"))
    if not slots:
        _say_none(request, answer, zone, viewer, now)
        return
    console.print(hanging(text_of(f"  first {stamp(slots[0], zone, viewer, now)}")))
    console.print(hanging(text_of(f"  last  {stamp(slots[-1], zone, viewer, now)}")))
    console.print(text_of(f"slots ({getattr(zone, 'key', 'UTC')} time, yours beside it):", "italic"))
    _slot_lines(slots, zone, viewer, now)


def _say_none(request: dict[str, Any], answer: dict[str, Any], zone: tzinfo, viewer: tzinfo, now: datetime) -> None:
    """Why nothing is to run, and the range as it was understood (the schedule's zone, yours beside)."""
    from celeryapp.interfaces.time_words import stamp

    console.print(hanging(text_of(f"  --from {stamp(request['start'], zone, viewer, now)}")))
    console.print(hanging(text_of(f"  --to   {stamp(request['end'], zone, viewer, now)}")))
    if answer.get("none_because"):
        console.print(hanging(text_of(f"  why: {answer['none_because']}", "yellow")))


@click.command("backfill")
@click.argument("name", required=False)
@click.option(
    "--from", "start", metavar="WHEN", help="First slot's earliest time (ISO 8601; no offset: the schedule's zone)."
)
@click.option("--to", "end", metavar="WHEN", help="Slots before this time (ISO 8601; no offset: the schedule's zone).")
@click.option(
    "--mode",
    type=click.Choice(["missing", "failed", "all"]),
    default="missing",
    show_default=True,
    help="missing: slots with no run; failed: whose last run failed or was cancelled; all.",
)
@click.option("--max-concurrent", type=int, default=1, show_default=True, help="Runs at a time (1 to 100).")
@click.option("--dry-run", is_flag=True, help="Only list the slots; start nothing.")
@click.option("--wait", is_flag=True, help="Follow it to its end; exit 0 only if every run completed.")
@click.option("--cancel", "cancel_id", type=int, default=None, metavar="ID", help="Cancel backfill ID instead.")
@click.option("--version", type=click.IntRange(1), default=None, help="Run this definition version (default: current).")
@yes_option
@acts
@json_option
def backfill_cmd(
    name: str | None,
    start: str | None,
    end: str | None,
    mode: str,
    max_concurrent: int,
    dry_run: bool,
    wait: bool,
    cancel_id: int | None,
    version: int | None,
    yes: bool,
    as_name: str | None,
    reason: str | None,
    as_json: bool,
) -> None:
    """Run a schedule's past slots from --from to --to, oldest first (asks first; --dry-run lists
    them); or --cancel ID: stop a backfill's slots not started (asks first).

    Times without an offset are the schedule's wall time (its time zone), as on the dashboard."""
    if cancel_id is not None:
        if name is not None or start is not None or end is not None:
            raise click.UsageError("--cancel ID takes no NAME, --from or --to")
        _cancel(cancel_id, yes, as_name, reason, as_json)
        return
    if name is None or start is None or end is None:
        raise click.UsageError("give NAME, --from and --to (or --cancel ID)")
    from celeryapp.interfaces.time_words import zone_of

    viewer, schedule = viewer_zone(), call("get_schedule", name)
    zone = zone_of(schedule["timezone"])
    request: dict[str, Any] = {
        "start": time_arg(start, zone, "--from"),
        "end": time_arg(end, zone, "--to"),
        "mode": mode,
        "max_concurrent": max_concurrent,
        **({} if version is None else {"version": version}),
    }
    listed = _flagged("backfill_schedule", name, dry_run=True, **request)
    if as_json and dry_run:
        echo_json(listed)
        return
    now = reference_now()
    if not as_json:  # stdout is the JSON answer alone
        _say_slots(name, listed, mode, zone, viewer, now, request)
        if schedule["status"] == "paused" and listed["count"]:
            console.print(hanging(text_of(f"{name} is paused: the runs start when it is resumed", "yellow")))
    if dry_run or not listed["count"]:
        if as_json:
            echo_json(listed)
        else:
            console.print(text_of("dry run: nothing started" if dry_run else "nothing to start", "dim"))
        return
    at_a_time = f"at most {max_concurrent} at a time" if max_concurrent > 1 else "one at a time"
    count = listed["count"]
    confirm(f"start {count} run{'' if count == 1 else 's'} of {name} ({at_a_time}, oldest first)?", yes)
    started = _flagged("backfill_schedule", name, actor=acting(as_name), reason=reason, **request)
    backfill_id = started["backfill_id"]
    if as_json and not (wait and backfill_id):
        echo_json(started)
        return
    if backfill_id is None:
        click.echo(printable(f"{name}: nothing started (those slots have runs now)"))
        return
    if not as_json:
        console.print(hanging(text_of(f"backfill #{backfill_id} of {name}: {started['count']} slots, oldest first")))
    if wait:
        _follow(backfill_id, as_json)
    console.print(hanging(text_of(f"follow it: chordbeat backfills {name}", "dim")))
    console.print(hanging(text_of(f"stop it: chordbeat backfill --cancel {backfill_id}", "dim")))


def _follow(backfill_id: int, as_json: bool) -> None:
    """A line each time the backfill's progress changes, until it ends; exit 0 only if every slot
    it started completed (none failed, none cancelled). Ctrl-C stops watching, not the backfill."""
    from celeryapp.interfaces.time_words import progress_words

    said = ""
    try:
        while True:
            backfill = call("get_backfill", backfill_id)
            progress = f"#{backfill_id} {backfill['status']}: {progress_words(backfill)}"
            if progress != said and not as_json:
                console.print(hanging(text_of(progress)))
                said = progress
            if backfill["status"] != "running":
                break
            time.sleep(WAIT_POLL_S)
    except KeyboardInterrupt:
        said = f"stopped watching; backfill #{backfill_id} goes on (chordbeat backfill --cancel {backfill_id} stops it)"
        console.print(hanging(text_of(said, "yellow")))
        sys.exit(130)
    if as_json:
        echo_json(backfill)
    ended_well = backfill["status"] == "completed" and not backfill["failed"] and not backfill["cancelled"]
    sys.exit(0 if ended_well else 1)


def _cancel(backfill_id: int, yes: bool, as_name: str | None, reason: str | None, as_json: bool) -> None:
    from celeryapp.interfaces.time_words import progress_words

    backfill = call("get_backfill", backfill_id)
    if backfill["status"] != "running":
        said = f"backfill #{backfill_id} of {backfill['schedule']}: already {backfill['status']}; nothing to cancel"
        echo_json(backfill) if as_json else click.echo(printable(said))
        return
    waiting = backfill["total"] - backfill["started"]
    total = backfill["total"]
    confirm(f"cancel backfill #{backfill_id} of {backfill['schedule']} ({waiting} of {total} slots not started)?", yes)
    backfill = call("cancel_backfill", backfill_id, actor=acting(as_name), reason=reason)
    if as_json:
        echo_json(backfill)
        return
    said = f"backfill #{backfill_id} of {backfill['schedule']}: {backfill['status']} ({progress_words(backfill)})"
    console.print(hanging(text_of(said)))
    if backfill["running"]:
        console.print(hanging(text_of("its runs in progress go on: chordbeat cancel EXECUTION_ID stops one", "dim")))


@click.command("backfills")
@click.argument("name")
@json_option
def backfills_cmd(name: str, as_json: bool) -> None:
    """A schedule's backfills and catch-ups, newest first, with their progress."""
    from celeryapp.interfaces.time_words import backfill_title, origin_words, progress_words, stamp, zone_of

    backfills = call("list_backfills", name, limit=BACKFILLS_SHOWN)
    if as_json:
        echo_json(backfills)
        return
    if not backfills:
        click.echo(printable(f"{name}: no backfills"))
        return
    now, viewer = reference_now(), viewer_zone()
    zone = zone_of(call("get_schedule", name)["timezone"])
    for b in backfills:
        console.print(hanging(text_of(f"{backfill_title(b)} ", "bold"), text_of(progress_words(b))))
        at_a_time = f"at most {b['max_concurrent']} at a time" if b["max_concurrent"] > 1 else "one at a time"
        console.print(hanging(text_of(f"  mode {b['mode']}, {at_a_time}", "dim")))
        if b["first_slot"]:
            console.print(hanging(text_of(f"  first slot {stamp(b['first_slot'], zone, viewer, now)}")))
            console.print(hanging(text_of(f"  last slot  {stamp(b['last_slot'], zone, viewer, now)}")))
        if b["next_slot"] and b["status"] == "running":
            console.print(hanging(text_of(f"  next slot  {stamp(b['next_slot'], zone, viewer, now)}")))
        by = f"  by {b['actor']}" if b["actor"] else f"  {origin_words(b)} by beat's fire"
        why = f": {b['reason']}" if b["reason"] else ""
        console.print(hanging(text_of(f"{by}, {stamp(b['created_at'], zone, viewer, now)}{why}", "dim")))
