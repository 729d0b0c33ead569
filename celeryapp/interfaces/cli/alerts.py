"""``chordbeat alerts``: what was raised and where it went, newest first; ``alerts ack ID``,
``alerts silence NAME --until WHEN --reason TEXT`` (after asking), ``alerts unsilence NAME`` and
``alerts test CHANNEL``, which waits for the test's delivery and says how it went."""

from __future__ import annotations

import sys
import time
from datetime import datetime, tzinfo
from typing import Any

import click
from rich.text import Text

from celeryapp.interfaces.cli.calls import (
    acting,
    acts,
    call,
    confirm,
    connected,
    console,
    echo_json,
    json_option,
    list_zone,
    moment_of,
    reference_now,
    viewer_zone,
    yes_option,
)
from celeryapp.interfaces.terminal import hanging, printable, text_of

#: How an alert's kind is coloured: trouble red, lateness yellow, news plain.
KIND_STYLES = {"failed": "bold red", "dead": "bold red", "missed": "bold yellow", "late": "bold yellow"}
#: How long ``alerts test`` waits for the delivery's first outcome by default.
TEST_WAIT_S = 30.0
#: How often it asks meanwhile.
TEST_POLL_S = 0.5


@click.group("alerts", invoke_without_command=True)
@click.option("--schedule", default=None, help="Only this schedule's alerts.")
@click.option(
    "--status",
    type=click.Choice(["open", "acknowledged", "silenced", "all"]),
    default="all",
    show_default=True,
    help="open: nobody acknowledged it (not silenced, not a resolved notice or a test).",
)
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 500))
@json_option
@click.pass_context
def alerts_cmd(ctx: click.Context, schedule: str | None, status: str, limit: int, as_json: bool) -> None:
    """Alerts, newest first, and where each was sent (times in the schedule's zone, else yours)."""
    if ctx.invoked_subcommand is not None:
        return
    rows: list[dict[str, Any]] = call("list_alerts", schedule=schedule, status=status, limit=limit)
    if as_json:
        echo_json(rows)
        return
    if not rows:
        console.print(text_of(f"no {'' if status == 'all' else status + ' '}alerts", "dim"))
        return
    now = reference_now()
    zone, viewer = list_zone({schedule} if schedule else {r["schedule"] for r in rows if r["schedule"]})
    for number, alert in enumerate(rows):
        if number:
            console.print()
        _print_alert(alert, zone, viewer, now)


def _print_alert(alert: dict[str, Any], zone: tzinfo, viewer: tzinfo | None, now: datetime) -> None:
    from celeryapp.interfaces.time_words import instants_in, stamp

    title = text_of(alert["kind"], KIND_STYLES.get(alert["kind"], "bold"))
    if alert["detail"]:
        title.append_text(text_of(f" ({alert['detail'].replace('_', ' ')})"))
    about = [alert["schedule"] or "no schedule"] + ([f"run {alert['execution_id']}"] if alert["execution_id"] else [])
    title.append_text(text_of(" " + ", ".join(about) + ": ")).append_text(_state(alert, now))
    console.print(hanging(title))
    console.print(hanging("  ", text_of(stamp(alert["at"], zone, viewer, now), "dim")))
    console.print(hanging("  ", text_of(instants_in(alert["message"], zone))))
    if alert["expected_at"]:
        console.print(hanging("  ", text_of(f"expected to finish {stamp(alert['expected_at'], zone, viewer, now)}")))
    for delivery in alert["deliveries"]:
        console.print(hanging("  ", _delivery(delivery, zone, viewer, now)))
    console.print(hanging(text_of("  id ", "dim"), text_of(alert["id"])))


def _state(alert: dict[str, Any], now: datetime) -> Text:
    from celeryapp.domain.times import parse_time
    from celeryapp.interfaces.time_words import relative

    if alert["acknowledged_by"]:
        ago = relative(parse_time(alert["acknowledged_at"]), now)
        return text_of(f"acknowledged by {alert['acknowledged_by']} {ago}", "green")
    if alert["silenced"]:
        return text_of("silenced (not sent)", "dim")
    if alert["kind"] in ("resolved", "test"):
        return text_of("notice", "dim")
    return text_of("open", "bold red")


def _delivery(delivery: dict[str, Any], zone: tzinfo, viewer: tzinfo | None, now: datetime) -> Text:
    from celeryapp.interfaces.time_words import stamp

    line = text_of(f"{delivery['channel']}: ", "bold")
    status, tries = delivery["status"], delivery["attempts"]
    if status == "delivered":
        return line.append_text(text_of(f"delivered {stamp(delivery['delivered_at'], zone, viewer, now)}", "green"))
    if status == "pending" and not delivery["last_error"]:
        return line.append_text(text_of("pending", "yellow"))
    tried = f" after {tries} {'try' if tries == 1 else 'tries'}" if tries else ""
    what = {"pending": f"failing{tried}, retrying", "failed": f"failed{tried}, given up"}.get(status, status)
    line.append_text(text_of(what, "red" if status != "summarised" else "dim"))
    return line.append_text(text_of(f": {delivery['last_error']}" if delivery["last_error"] else ""))


@alerts_cmd.command("ack")
@click.argument("alert_id", metavar="ID")
@acts
@json_option
def ack_cmd(alert_id: str, as_name: str | None, reason: str | None, as_json: bool) -> None:
    """Acknowledge an alert: somebody is on it (its deliveries go on)."""
    who = acting(as_name)
    alert = call("acknowledge_alert", alert_id, actor=who, reason=reason)
    if as_json:
        echo_json(alert)
        return
    by = alert["acknowledged_by"]
    said = "acknowledged" if by == who else f"already acknowledged by {by}"
    click.echo(printable(f"{alert['id']}: {said}"))


def until_of(text: str, now: datetime, zone: tzinfo) -> str:
    """``--until`` as the service takes it (ISO 8601 with its offset): a length from now (``2h``),
    or a date and time, read in the viewer's zone when it names no offset of its own."""
    return moment_of(text, now, zone, flag="--until", ahead=True).isoformat()


@alerts_cmd.command("silence")
@click.argument("name")
@click.option("--until", "until", required=True, metavar="WHEN", help="2h, 1d, or a time (2026-11-25 06:00: yours).")
@click.option("--reason", required=True, help="Why, for the audit trail (at most 500 characters).")
@click.option(
    "--as", "as_name", default=None, metavar="NAME", help="Who acts (default: $CHORDBEAT_ACTOR or user@host)."
)
@yes_option
@json_option
def silence_cmd(name: str, until: str, reason: str, as_name: str | None, yes: bool, as_json: bool) -> None:
    """Send no alert of a schedule until WHEN (asks first; they are still kept and listed)."""
    from celeryapp.interfaces.time_words import stamp

    now, viewer = reference_now(), viewer_zone()
    end = until_of(until, now, viewer)
    confirm(f"silence {name}'s alerts until {stamp(end, viewer, None, now)}?", yes)
    with connected() as client:
        silence = client.silence_schedule(name, end, reason=reason, actor=acting(as_name))
    if as_json:
        echo_json(silence)
        return
    click.echo(printable(f"{name}: silenced until {stamp(silence['silenced_until'], viewer, None, now)}"))


@alerts_cmd.command("unsilence")
@click.argument("name")
@acts
@json_option
def unsilence_cmd(name: str, as_name: str | None, reason: str | None, as_json: bool) -> None:
    """Send a schedule's alerts again from now (those raised while silenced stay unsent)."""
    ended = call("unsilence_schedule", name, actor=acting(as_name), reason=reason)
    if as_json:
        echo_json(ended)
        return
    click.echo(printable(f"{name}: {'alerts are sent again' if ended['changed'] else 'was not silenced'}"))


@alerts_cmd.command("test")
@click.argument("channel")
@click.option(
    "--wait", "wait_s", default=TEST_WAIT_S, show_default=True, type=click.FloatRange(1, 600), help="Seconds."
)
@acts
def test_cmd(channel: str, wait_s: float, as_name: str | None, reason: str | None) -> None:
    """Send a test alert down CHANNEL and wait for its delivery: delivered, or failed and why."""
    from celeryapp.interfaces.time_words import stamp

    with connected() as client:
        alert = client.test_alert(channel, actor=acting(as_name), reason=reason)
        click.echo(printable(f"test alert {alert['id']} written; waiting up to {wait_s:g} s for {channel}…"))
        deadline = time.monotonic() + wait_s
        delivery = alert["deliveries"][0]
        while delivery["status"] == "pending" and not delivery["last_error"] and time.monotonic() < deadline:
            time.sleep(TEST_POLL_S)  # polling the service: the delivery is the sender's, elsewhere
            delivery = client.get_alert(alert["id"])["deliveries"][0]
    now = reference_now()
    if delivery["status"] == "delivered":
        click.echo(printable(f"{channel}: delivered {stamp(delivery['delivered_at'], viewer_zone(), None, now)}"))
        return
    if delivery["last_error"]:
        retry = " (the sender retries it)" if delivery["status"] == "pending" else ""
        click.echo(printable(f"{channel}: failed{retry}: {delivery['last_error']}"), err=True)
    else:
        tries = delivery["attempts"]
        tried = f"{tries} {'try' if tries == 1 else 'tries'} so far" if tries else "not tried yet: is a worker running?"
        click.echo(
            printable(f"{channel}: no outcome within {wait_s:g} s ({tried}); `chordbeat alerts` shows it later"),
            err=True,
        )
    sys.exit(1)
