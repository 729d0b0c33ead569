"""The shared limits' service tasks: define, list, read and delete limits, each change audited.

Every argument is checked before the transaction opens (anyone who can publish can call these);
each refusal names its argument. Applying a limit made larger admits its waiters at once; the
steps they start are not sent yet: steps do not use limits before the step path is wired to them
(docs/limits.md, "Not yet wired").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from celeryapp.domain.shared_limits import parse_limit
from celeryapp.execution.limit_slots import settle
from celeryapp.execution.limit_store import delete_limit as delete_stored
from celeryapp.execution.limit_store import limit_detail, limit_summaries, put_limit
from celeryapp.interfaces.arguments import actor_arg, flag_arg, name_arg, reason_arg
from celeryapp.states import AuditAction, AuditSource
from models import transaction
from models.session import retried_transaction

if TYPE_CHECKING:
    from celeryapp.application import ChordbeatCelery


def apply_limit(
    app: ChordbeatCelery,
    definition: Any,
    actor: Any = None,
    reason: Any = None,
    *,
    source: AuditSource = AuditSource.SERVICE,
) -> dict[str, Any]:
    """Create or change a limit; an invalid definition names every bad field and stores nothing.
    A change never pre-empts a holder; a limit made larger admits its waiters at once."""
    limit = parse_limit(definition)
    who, why = actor_arg(actor, source), reason_arg(reason)

    def store(session: Session) -> dict[str, Any]:
        stored = put_limit(session, limit)
        if stored.changed:
            settle(session, [stored.id])
            action = AuditAction.LIMIT_APPLIED
            detail = {"limit": limit.name, "created": stored.created, "definition": limit.to_json()}
            who.record(session, action, None, reason=why, detail=detail)
        return limit_detail(session, limit.name)

    return retried_transaction(app.settings.database_url, f"applying limit {limit.name!r}", store)


def list_limits(app: ChordbeatCelery) -> list[dict[str, Any]]:
    with transaction(app.settings.database_url, read_only=True) as session:
        return limit_summaries(session)


def get_limit(app: ChordbeatCelery, name: Any) -> dict[str, Any]:
    name = name_arg(name)
    with transaction(app.settings.database_url, read_only=True) as session:
        return limit_detail(session, name)


def delete_limit(
    app: ChordbeatCelery,
    name: Any,
    force: Any = False,
    actor: Any = None,
    reason: Any = None,
    *,
    source: AuditSource = AuditSource.SERVICE,
) -> dict[str, Any]:
    """Delete a limit; refused while held unless ``force``."""
    name = name_arg(name)
    forced = flag_arg(force, "force")
    who, why = actor_arg(actor, source), reason_arg(reason)

    def remove(session: Session) -> dict[str, Any]:
        deleted = delete_stored(session, name, force=forced)
        detail = {
            "limit": name,
            "force": forced,
            "held_slots": deleted.held_slots,
            "dropped_waiters": len(deleted.dropped_waiters),
        }
        who.record(session, AuditAction.LIMIT_DELETED, None, reason=why, detail=detail)
        return {"name": name, "deleted": True}

    return retried_transaction(app.settings.database_url, f"deleting limit {name!r}", remove)
