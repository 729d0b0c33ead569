"""Commands that work on the database directly, before any worker exists (deploy jobs,
``make run``): ``db upgrade`` and ``apply`` of a declarative schedule file."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import click

from celeryapp.errors import ChordbeatError, DefinitionError
from celeryapp.interfaces.arguments import actor_arg, reason_arg
from celeryapp.interfaces.cli.calls import acting, acts, built_app, console, echo_json, flag_text, json_option
from celeryapp.interfaces.terminal import printable, text_of
from celeryapp.states import AuditSource


@click.group()
def db() -> None:
    """Database schema."""


@db.command("upgrade")
def db_upgrade() -> None:
    """Create or migrate the schema (idempotent)."""
    from models.migrate import upgrade

    upgrade(built_app().settings.database_url)
    click.echo("database is up to date")


@click.command("apply")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--dry-run", is_flag=True, help="Show what would change; change nothing.")
@click.option("--yes", "--prune", "yes", is_flag=True, help="Remove the file's dropped schedules without asking.")
@click.option(
    "--commit",
    default=None,
    metavar="ID",
    callback=lambda _ctx, _param, value: _commit_of(value),
    help="The commit the file is at, kept with the versions it makes (default: git's, in a repository).",
)
@acts
@json_option
def apply_cmd(
    path: str, dry_run: bool, yes: bool, commit: str | None, as_name: str | None, reason: str | None, as_json: bool
) -> None:
    """Apply a declarative schedule file (file schedules override stored ones).

    Only schedules of the file's own source (its 'source:', by default its name without the
    extension) that it no longer names are removed, after confirmation. Each changed schedule
    gets a new definition version; --dry-run shows what would differ, field by field.
    """
    from celeryapp.scheduling.schedule_file import apply_file, read_app_file

    app = built_app()
    try:
        # Read once: the dry run shows what the file changes, the apply writes the same file as read.
        schedule_file = read_app_file(app, path)
        diff = apply_file(app, path, dry_run=True, schedule_file=schedule_file)
        if not dry_run:
            remove: bool | list[str] = True
            remove_limits: bool | list[str] = True
            dropped_limits = diff.limits.get("removed", [])
            if (diff.removed or dropped_limits) and not yes:
                _show_diff(diff, path)
                _confirm_removal(diff.source, diff.removed, dropped_limits)
                remove, remove_limits = diff.removed, dropped_limits
            diff = apply_file(
                app,
                path,
                remove=remove,
                remove_limits=remove_limits,
                actor=actor_arg(acting(as_name), AuditSource.CLI),
                reason=reason_arg(reason),
                commit=commit,
                schedule_file=schedule_file,
            )
    except ChordbeatError as exc:
        raise Refused(exc, console.width) from None
    if diff.checked_here:
        # Said, not failed: the steps passed this process's check, which may differ from the workers'.
        click.echo("\n".join(_wrapped(f"note: {diff.checked_here}", console.width, "", "  ")), err=True)
    if as_json:
        echo_json({"dry_run": dry_run, **diff.as_json()})
        return
    _show_diff(diff, path, field_by_field=dry_run)
    click.echo(printable(f"{'would change' if dry_run else 'applied'} (source {diff.source}): {diff.summary()}"))


def _commit_of(value: str | None) -> str | None:
    from models.version_tables import COMMIT_LENGTH

    return flag_text(value, "--commit", COMMIT_LENGTH)


def _show_diff(diff: Any, path: str, *, field_by_field: bool = False) -> None:
    from celeryapp.interfaces.cli.versions import print_differences

    # Limits first: they are applied first, and the schedules below may use them.
    for label, kind, style in (("+", "added", "green"), ("~", "changed", "yellow"), ("-", "removed", "red")):
        for name in diff.limits.get(kind, []):
            console.print(text_of(f"{label} limit {name}", style))
    for name in diff.limits.get("taken_over", []):
        console.print(text_of(f"! limit {name}: taken over (from the API or another file)", "yellow"))
    for label, names, style in (("+", diff.added, "green"), ("~", diff.changed, "yellow"), ("-", diff.removed, "red")):
        for name in names:
            fields = diff.fields.get(name)
            console.print(text_of(f"{label} {name}" + (f" ({', '.join(fields)})" if fields else ""), style))
            if field_by_field and name in diff.differences:
                print_differences(diff.differences[name], indent="    ")
    for name, owner in diff.taken_over.items():
        console.print(text_of(f"! {name}: taken over from {owner}", "yellow"))
    if diff.removed or diff.limits.get("removed"):
        # A removal nobody expected is mostly two files of one name (the default source): say so.
        click.echo("\n".join(_wrapped(_why_removed(diff.source, Path(path)), console.width, "", "  ")), err=True)


def _why_removed(source: str, path: Path) -> str:
    named = (
        f"its name without {path.suffix!r}; a 'source:' in the file would name it otherwise"
        if path.stem == source and path.suffix
        else "its 'source:'"
    )
    return (
        f"why '-': {path.name} is the source {source!r} ({named}); schedules applied from that source "
        "that the file does not name are removed. Another file of yours of that source? Give one of them "
        "its own 'source:'."
    )


def _confirm_removal(source: str, names: list[str], limits: list[str]) -> None:
    """Returns when the operator agreed to remove these schedules and limits; refuses (nothing
    changed) otherwise."""
    what = " and ".join([f"{len(names)} schedule(s)"] * bool(names) + [f"{len(limits)} limit(s)"] * bool(limits))
    question = f"remove {what} of source {source} that the file no longer names?"
    try:
        if click.confirm(printable(question), default=False, err=True):
            return
    except click.Abort:  # no terminal to ask in (end of input)
        pass
    listed = ", ".join([*names, *(f"limit {name}" for name in limits)])
    raise click.ClickException(printable(f"nothing applied: removing {listed} needs confirmation (or --prune)"))


class Refused(ChordbeatError, click.ClickException):
    """Every mistake at once, one per line, wrapped at words within ``width`` columns: a long
    reason that the terminal broke mid-word would be hard to read at 80 columns."""

    def __init__(self, exc: ChordbeatError, width: int) -> None:
        if isinstance(exc, DefinitionError) and len(exc.errors) > 1:
            lines = [f"{len(exc.errors) + exc.more} mistakes; nothing applied:"]
            for line in [*map(str, exc.errors), *([f"... and {exc.more} more"] if exc.more else [])]:
                lines += _wrapped(line, width, "  ", "    ")
        else:
            # The first line follows click's "Error: ".
            lines = _wrapped(str(exc), width, " " * len("Error: "), "  ")
            lines[0] = lines[0].lstrip()
        super().__init__("\n".join(lines))


def _wrapped(text: str, width: int, first: str, rest: str) -> list[str]:
    """``text``'s first line wrapped at words; its further lines (an excerpt of a file with a
    caret under a column) kept as they are."""
    head, *excerpt = printable(text).split("\n")
    lines = textwrap.wrap(
        head, width - 1, initial_indent=first, subsequent_indent=rest, break_long_words=False, break_on_hyphens=False
    )
    return lines + [rest + line for line in excerpt]
