"""A schedule file's ``limits:`` made the stored limits of its source, in the file's transaction.

A limit the file names is created or changed (a file takes over a limit of the same name made
through the service tasks or another file, as it does schedules). A limit its source declared
before that the file no longer names is deleted, but never while it is held: the whole file is
refused naming it. Dropping what a running step holds is a separate, forced and audited act
(``chordbeat limits delete NAME --force``), never a side effect of an edited file, which beat also
applies at its start unattended.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from celeryapp.domain.effects import Effects
from celeryapp.domain.shared_limits import parse_limit
from celeryapp.errors import DefinitionError
from celeryapp.execution.limit_slots import settle
from celeryapp.execution.limit_steps import admitted_steps
from celeryapp.execution.limit_store import delete_limit, put_limit
from models import utcnow
from models.limit_tables import LIMITS

#: The kinds of change a file makes to limits, as :func:`apply_file_limits` reports them.
CHANGE_KINDS = ("added", "changed", "removed", "unchanged", "kept", "taken_over")


def apply_file_limits(
    session: Session,
    raw_limits: Sequence[Mapping[str, Any]],
    *,
    source: str,
    dry_run: bool = False,
    remove: bool | Collection[str] = True,
) -> tuple[dict[str, list[str]], Effects]:
    """Make the limits of ``source`` those of ``raw_limits`` (validated definitions); a dry run
    changes nothing but refuses what the apply would refuse. ``remove``: which of the source's
    limits the file no longer names may go (all, none, or those named: the confirmed ones).

    Returns the changes, and the waiting steps a limit made larger admitted: queued, their slots
    held, to be sent once the file's transaction commits."""
    definitions = [parse_limit(raw) for raw in raw_limits]
    changes: dict[str, list[str]] = {kind: [] for kind in CHANGE_KINDS}
    # Every limit locked in id order (the order every slot transaction takes them in): what is
    # held cannot change between the check and the delete.
    query = select(LIMITS.c.id, LIMITS.c.name, LIMITS.c.definition, LIMITS.c.in_use, LIMITS.c.source_name)
    rows = session.execute(query.order_by(LIMITS.c.id) if dry_run else query.order_by(LIMITS.c.id).with_for_update())
    stored = {row.name: row for row in rows}
    wanted = {definition.name for definition in definitions}
    going = [
        name
        for name, row in sorted(stored.items())
        if row.source_name == source
        and name not in wanted
        and (remove is True or (remove is not False and name in remove))
    ]
    held = [f"{name!r} ({stored[name].in_use} slots in use)" for name in going if stored[name].in_use]
    if held:
        raise DefinitionError(
            "limits",
            f"the file no longer names {', '.join(held)}, still held: nothing applied. Apply it once "
            "the holders have ended, or delete the limit first with 'chordbeat limits delete NAME --force'",
        )
    grown: list[int] = []
    for definition in definitions:
        row = stored.get(definition.name)
        if row is not None and row.source_name != source:
            changes["taken_over"].append(definition.name)
        if dry_run:
            kind = "added" if row is None else "unchanged" if row.definition == definition.to_json() else "changed"
            changes[kind].append(definition.name)
            continue
        put = put_limit(session, definition)
        changes["added" if put.created else "changed" if put.changed else "unchanged"].append(definition.name)
        if put.changed:
            grown.append(put.id)
        if row is None or row.source_name != source:
            session.execute(update(LIMITS).where(LIMITS.c.id == put.id).values(source_name=source))
    for name, row in sorted(stored.items()):
        if row.source_name == source and name not in wanted:
            changes["removed" if name in going else "kept"].append(name)
            if name in going and not dry_run:
                delete_limit(session, name, force=False)
    if not grown:
        return changes, Effects()
    # A limit made larger admits its waiters now, as applying it through the service does.
    return changes, admitted_steps(session, settle(session, grown), now=utcnow())
