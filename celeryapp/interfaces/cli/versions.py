"""Commands about definition versions: ``versions`` (a schedule's), ``diff`` (two of them) and
``rollback`` (to one, after asking) (docs/versions.md)."""

from __future__ import annotations

import json
from typing import Any

import click

from celeryapp.domain.limits import MAX_ID
from celeryapp.interfaces.cli.calls import (
    acting,
    acts,
    ask_reason,
    call,
    confirm,
    console,
    echo_json,
    json_option,
    list_zone,
    reference_now,
    yes_option,
    zone_title,
)
from celeryapp.interfaces.terminal import TIME_WIDTH, hanging, new_table, printable, text_of, time_cell

VERSION = click.IntRange(1, MAX_ID)
#: Characters of a hash or a commit id shown in the list (``--json`` has them whole).
SHORT_ID = 10
#: How each kind of difference is marked, and its colour.
MARKS = {"added": ("+", "green"), "removed": ("-", "red"), "changed": ("~", "yellow")}


@click.command("versions")
@click.argument("name")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 1000))
@click.option("--before", default=None, type=VERSION, help="Only versions older than this one.")
@json_option
def versions_cmd(name: str, limit: int, before: int | None, as_json: bool) -> None:
    """A schedule's definition versions, newest first: who made each, from where and why."""
    rows: list[dict[str, Any]] = call("list_versions", name, limit=limit, before=before)
    if as_json:
        echo_json(rows)
        return
    now = reference_now()
    zone, viewer = list_zone({name})
    table = new_table()
    table.add_column("v", justify="right")
    table.add_column(f"when ({zone_title(zone, now)})", min_width=TIME_WIDTH)
    table.add_column("who", overflow="fold")
    table.add_column("why")
    for row in rows:
        who = text_of(row["actor"])
        who.append_text(text_of(f"\n{row['source']}", "dim"))
        why = text_of(row["reason"] or "")
        if row["file"]:
            at = f" @ {row['commit'][:SHORT_ID]}" if row["commit"] else ""
            why.append_text(text_of(f"\n{row['file']}{at}", "dim"))
        why.append_text(text_of(f"\nsha256 {row['hash'][:SHORT_ID]}", "dim"))
        table.add_row(str(row["version"]), time_cell(row["at"], zone, viewer, now), who, why)
    console.print(table if rows else text_of("no versions", "dim"))


@click.command("diff")
@click.argument("name")
@click.argument("a", type=VERSION)
@click.argument("b", type=VERSION)
@json_option
def diff_cmd(name: str, a: int, b: int, as_json: bool) -> None:
    """What changed in a schedule's definition from version A to version B, field by field."""
    differences: list[dict[str, Any]] = call("diff_versions", name, a, b)
    if as_json:
        echo_json(differences)
        return
    print_differences(differences)
    if not differences:
        console.print(text_of(f"versions {a} and {b} of {name} are the same definition", "dim"))


@click.command("rollback")
@click.argument("name")
@click.option("--to", "version", required=True, type=VERSION, help="The version whose definition comes back.")
@yes_option
@acts
@json_option
def rollback_cmd(name: str, version: int, yes: bool, as_name: str | None, reason: str | None, as_json: bool) -> None:
    """Make a schedule's definition that of an earlier version again, as a new version (shows
    what changes and asks first; asks why, unless --reason)."""
    current = call("get_schedule", name)["version"]
    differences: list[dict[str, Any]] = call("diff_versions", name, current, version)
    if not as_json:
        print_differences(differences)
    if not differences:
        click.echo(printable(f"{name}: version {current} is the definition of version {version}; nothing to do"))
        return
    if reason is None and not yes:
        reason = ask_reason(f"why roll back to version {version}?")
    confirm(f"roll {name} back to version {version} (now version {current})?", yes)
    schedule = call("rollback_schedule", name, version, actor=acting(as_name), reason=reason)
    if as_json:
        echo_json(schedule)
        return
    click.echo(printable(f"{name}: version {schedule['version']} (the definition of version {version})"))


def print_differences(differences: list[dict[str, Any]], indent: str = "") -> None:
    """One line a difference, marked ``+``, ``-`` or ``~``, the values as JSON, wrapped at words."""
    for difference in differences:
        mark, style = MARKS[difference["op"]]
        old, new = (json.dumps(difference[key], ensure_ascii=False) for key in ("old", "new"))
        shown = {"added": new, "removed": old, "changed": f"{old} → {new}"}[difference["op"]]
        console.print(hanging(text_of(f"{indent}{mark} {difference['path']}: ", style), text_of(shown)))
