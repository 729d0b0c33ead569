"""``chordbeat limits``: the shared limits with what is held of them and who waits; ``limits show
NAME`` (holders, waiters oldest first, the slots each key holds), ``limits set NAME --slots N``
(creates or changes one, after asking) and ``limits delete NAME`` (after asking; ``--force``
while it is held)."""

from __future__ import annotations

import textwrap
from datetime import datetime
from typing import Any

import click
from rich.table import Table

from celeryapp.interfaces.cli.calls import (
    acting,
    acts,
    call,
    confirm,
    console,
    echo_json,
    json_option,
    reference_now,
    yes_option,
)
from celeryapp.interfaces.terminal import hanging, new_table, printable, text_of

#: What ``set`` may change, as the options name them and as the definition names them.
SETTABLE = {
    "slots": "slots",
    "rate": "rate",
    "key": "key",
    "per_key_slots": "per_key_slots",
    "on_full": "on_full",
    "max_wait": "max_wait",
}
#: Written for an optional field to take it away: ``--rate none``.
NONE_WORDS = frozenset({"none", "null", "-"})


def _asked(method: str, *args: Any, **kwargs: Any) -> Any:
    """The service's answer; its refusal (a definition's mistakes name their fields, and run long)
    wrapped at words to the terminal's width, under click's ``Error: ``."""
    try:
        return call(method, *args, **kwargs)
    except click.ClickException as exc:
        raise _refusal(exc.message) from None


def _refusal(message: str) -> click.ClickException:
    indent = " " * len("Error: ")
    lines = [
        line
        for part in message.split("\n")
        for line in textwrap.wrap(
            part, console.width - 1, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False
        )
    ]
    return click.ClickException("\n".join(lines).removeprefix(indent))


def _age(since: str | None, now: datetime) -> str:
    from celeryapp.domain.times import NOTHING, parse_time, span

    moment = parse_time(since)
    return NOTHING if moment is None else span(max(0.0, (now - moment).total_seconds()))


def _use(limit: dict[str, Any]) -> str:
    return f"{limit['in_use']}/{limit['slots']}"


@click.group("limits", invoke_without_command=True)
@json_option
@click.pass_context
def limits_cmd(ctx: click.Context, as_json: bool) -> None:
    """Shared limits: slots, in use, waiting, rate, key and the oldest waiter's age."""
    if ctx.invoked_subcommand is not None:
        return
    rows: list[dict[str, Any]] = _asked("list_limits")
    if as_json:
        echo_json(rows)
        return
    if not rows:
        console.print(text_of("no limits (define one: chordbeat limits set NAME --slots N)", "dim"))
        return
    now = reference_now()
    table = new_table("name", "in use", "waiting", "rate", "key", "oldest wait")
    for limit in rows:
        full = limit["in_use"] >= limit["slots"]
        per_key = f"\n{limit['per_key_slots']} per key" if limit.get("per_key_slots") else ""
        table.add_row(
            text_of(limit["name"]),
            text_of(_use(limit), "bold yellow" if full else ""),
            text_of(limit["waiting"], "yellow" if limit["waiting"] else ""),
            text_of(limit.get("rate") or "-"),
            text_of((limit.get("key") or "-") + per_key),
            text_of(_age(limit.get("oldest_waiting_since"), now) if limit["waiting"] else "-"),
        )
    console.print(table)


@limits_cmd.command("show")
@click.argument("name")
@json_option
def show_cmd(name: str, as_json: bool) -> None:
    """A limit: its definition, holders, waiters (oldest first) and the slots each key holds."""
    limit: dict[str, Any] = _asked("get_limit", name)
    if as_json:
        echo_json(limit)
        return
    now = reference_now()
    console.print(text_of(f"{limit['name']}: {_use(limit)} in use, {limit['waiting']} waiting", "bold"))
    console.print(hanging(text_of(f"  {_definition_words(limit)}")))
    if limit["waiting"]:
        console.print(hanging(text_of(f"  oldest waiter waiting {_age(limit.get('oldest_waiting_since'), now)}")))
    for title, entries, total in (
        ("holders (longest-held first)", limit["holders"], limit["in_use"]),
        ("waiters (oldest first)", limit["waiters"], limit["waiting"]),
    ):
        console.print()
        if not entries:
            console.print(text_of(f"no {title.split()[0]}", "dim"))
            continue
        console.print(_entries_table(title, entries, now))
        if len(entries) < total and title.startswith("waiters"):
            console.print(text_of(f"... and {total - len(entries)} more waiting", "dim"))
    if limit.get("key"):
        console.print()
        table = new_table("key", "in use", title="slots held per key")
        for key, used in limit["keys"].items():
            table.add_row(text_of(key or "-"), text_of(used))
        console.print(table if limit["keys"] else text_of("no key holds a slot", "dim"))


def _definition_words(limit: dict[str, Any]) -> str:
    words = [f"{limit['slots']} slots"]
    if limit.get("rate"):
        words.append(f"rate {limit['rate']}")
    if limit.get("key"):
        per_key = f", {limit['per_key_slots']} per key" if limit.get("per_key_slots") else ""
        words.append(f"key {limit['key']}{per_key}")
    words.append(f"on full: {limit.get('on_full') or 'queue'}")
    if limit.get("max_wait") is not None:
        from celeryapp.domain.times import span

        words.append(f"starved after {span(limit['max_wait'])}")
    return ", ".join(words)


def _entries_table(title: str, entries: list[dict[str, Any]], now: datetime) -> Table:
    table = new_table("run", "step", "key", "slots", "for", title=title)
    for entry in entries:
        table.add_row(
            text_of(entry["execution_id"]),
            text_of(entry["step"]),
            text_of(entry["key"] or "-"),
            text_of(entry["slots"]),
            text_of(_age(entry["since"], now)),
        )
    return table


@limits_cmd.command("set")
@click.argument("name")
@click.option("--slots", type=int, default=None, help="Slots held at once, all keys together (1-10000).")
@click.option("--rate", default=None, metavar="N/PERIOD", help="At most N starts per period (60/min); 'none' drops it.")
@click.option(
    "--key", default=None, metavar="TEMPLATE", help="A key per step run ({payload.customer}); 'none' drops it."
)
@click.option("--per-key-slots", "per_key_slots", type=int, default=None, help="Slots one key may hold (with a key).")
@click.option(
    "--on-full", "on_full", type=click.Choice(["queue", "skip"]), default=None, help="Wait, or skip the step."
)
@click.option(
    "--max-wait", "max_wait", default=None, metavar="SECONDS", help="Raise 'starved' past it; 'none' drops it."
)
@yes_option
@acts
@json_option
def set_cmd(
    name: str,
    yes: bool,
    as_name: str | None,
    reason: str | None,
    as_json: bool,
    **given: Any,
) -> None:
    """Create a limit or change it (asks first). What is not given is kept; a resize never
    pre-empts a holder, and a limit made larger admits its waiters at once."""
    current = _current(name)
    definition = {k: v for k, v in (current or {"name": name}).items() if k in {"name", *SETTABLE.values()}}
    for option, field in SETTABLE.items():
        value = given[option]
        if value is None:
            continue
        definition[field] = _value(option, value)
    if current is None and definition.get("slots") is None:
        raise click.UsageError("a new limit needs --slots", click.get_current_context())
    # A new limit's fields as given; a change's as "before -> after".
    changes = [
        f"{field} {_shown(definition.get(field))}"
        if current is None
        else f"{field} {_shown(current.get(field))} -> {_shown(definition.get(field))}"
        for field in SETTABLE.values()
        if (current or {}).get(field) != definition.get(field)
    ]
    if current is not None and not changes:
        click.echo(printable(f"{name}: unchanged ({_use(current)} in use); nothing to do"))
        return
    held = f"; {current['in_use']} slots held now, never pre-empted" if current else ""
    what = "create limit" if current is None else "change limit"
    confirm(f"{what} {name}: {', '.join(changes)}{held}?", yes)
    # The version read: a change made meanwhile (another field) is refused, not overwritten.
    version = 0 if current is None else current["version"]
    stored = _asked("apply_limit", definition, actor=acting(as_name), reason=reason, expected_version=version)
    if as_json:
        echo_json(stored)
        return
    click.echo(printable(f"{name}: {'created' if current is None else 'changed'}; {_use(stored)} in use"))


def _current(name: str) -> dict[str, Any] | None:
    """The limit as stored, or ``None`` when there is none of that name (``set`` creates it)."""
    from celeryapp.interfaces.cli.calls import connected

    with connected() as client:
        for limit in client.list_limits():
            if limit["name"] == name:
                return dict(limit)
    return None


def _value(option: str, text: Any) -> Any:
    """An option's value as the definition takes it: a count as given (the service checks it and
    names the field), a word that drops an optional field as null, ``--max-wait`` as a number."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    if option in ("rate", "key", "max_wait") and str(text).strip().lower() in NONE_WORDS:
        return None
    if option == "max_wait":
        try:
            return float(text) if not str(text).strip().isdigit() else int(text)
        except ValueError:
            raise click.BadParameter(
                printable(f"{text!r} is not a number of seconds"), param_hint="--max-wait"
            ) from None
    return text


def _shown(value: Any) -> str:
    return "-" if value is None else str(value)


@limits_cmd.command("delete")
@click.argument("name")
@click.option("--force", is_flag=True, help="Delete it even while held: the holders run on, its waiters fail.")
@yes_option
@acts
@json_option
def delete_cmd(name: str, force: bool, yes: bool, as_name: str | None, reason: str | None, as_json: bool) -> None:
    """Delete a limit (asks first); refused while held unless --force."""
    limit: dict[str, Any] = _asked("get_limit", name)
    if limit["in_use"] and not force:
        raise _refusal(
            printable(
                f"{name} is held ({limit['in_use']} slots in use); wait for its holders to end, or "
                "delete it with --force (the holders run on, its waiters fail)"
            )
        )
    what = f"{_use(limit)} in use, {limit['waiting']} waiting"
    dropped = " (the holders run on; every step waiting for it fails)" if force and limit["in_use"] else ""
    confirm(f"delete limit {name} ({what}){dropped}?", yes)
    deleted = _asked("delete_limit", name, force=force, actor=acting(as_name), reason=reason)
    echo_json(deleted) if as_json else click.echo(printable(f"{name}: deleted"))
