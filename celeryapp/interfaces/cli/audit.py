"""``chordbeat audit``: who did what, newest first: operators' changes from the CLI, the dashboard
and other services, and beat's own decisions (retries, dead schedules, timeouts)."""

from __future__ import annotations

import json
from typing import Any

import click

from celeryapp.domain.limits import MAX_ID
from celeryapp.interfaces.cli.calls import (
    call,
    console,
    echo_json,
    flag_text,
    json_option,
    list_zone,
    moment_of,
    reference_now,
    viewer_zone,
    zone_title,
)
from celeryapp.interfaces.terminal import TIME_WIDTH, new_table, text_of, time_cell
from celeryapp.states import AuditAction
from models.audit import ACTOR_CHARS


@click.command("audit")
@click.option("--schedule", default=None, help="Only this schedule's rows.")
@click.option("--execution", "execution_id", default=None, type=click.IntRange(1, MAX_ID), help="Only this run's rows.")
@click.option("--actor", default=None, metavar="NAME", help="Only rows of this actor (exactly as shown).")
@click.option("--action", default=None, type=click.Choice([a.value for a in AuditAction]), help="Only this action.")
@click.option(
    "--since", default=None, metavar="WHEN", help="Rows since 2h, 1d ago, or a time (2026-11-25 06:00: yours)."
)
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 500))
@json_option
def audit_cmd(
    schedule: str | None,
    execution_id: int | None,
    actor: str | None,
    action: str | None,
    since: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """Who did what and why, newest first (times in the schedule's zone, else yours)."""
    from celeryapp.interfaces.audit import source_said
    from celeryapp.interfaces.display import label
    from celeryapp.interfaces.time_words import instants_in

    actor = flag_text(actor, "--actor", ACTOR_CHARS)
    now = reference_now()
    start = None if since is None else moment_of(since, now, viewer_zone(), flag="--since", ahead=False).isoformat()
    rows: list[dict[str, Any]] = call(
        "list_audit", schedule=schedule, limit=limit, execution_id=execution_id, actor=actor, action=action, since=start
    )
    if as_json:
        echo_json(rows)
        return
    zone, viewer = list_zone({schedule} if schedule else {r["schedule"] for r in rows if r["schedule"]})
    table = new_table()
    table.add_column(f"when ({zone_title(zone, now)})", min_width=TIME_WIDTH)
    table.add_column("who", overflow="fold")  # a host name is one long word; all of it is shown
    table.add_column("what")
    table.add_column("why")
    for row in rows:
        who = text_of(row["actor"])
        who.append_text(text_of(f"\n{source_said(row)}", "dim"))
        what = text_of(label(row["action"]), "bold")
        target = " ".join(
            part for part in (row["schedule"], f"#{row['execution_id']}" if row["execution_id"] else "") if part
        )
        what.append_text(text_of(f"\n{target}" if target else ""))
        why = text_of(instants_in(row["reason"], zone)) if row["reason"] else text_of(_detail(row.get("detail")), "dim")
        table.add_row(time_cell(row["at"], zone, viewer, now), who, what, why)
    console.print(table if rows else text_of("nothing recorded yet", "dim"))


def _detail(detail: Any) -> str:
    """A row's detail when it has no reason: ``change: added`` rather than JSON."""
    if isinstance(detail, dict):
        return ", ".join(f"{key}: {json.dumps(value, ensure_ascii=False)}" for key, value in detail.items())
    return "" if detail is None else json.dumps(detail, ensure_ascii=False)
