"""The shared limits' service tasks: define, list, read and delete limits, each change audited.

Every argument is checked before the transaction opens (anyone who can publish can call these);
each refusal names its argument. Applying a limit made larger admits its waiters at once, and
their steps are sent after commit; a forced delete fails the steps that waited for the limit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from celeryapp.domain.effects import Effects, GroupDispatch
from celeryapp.domain.limits import check_int
from celeryapp.domain.shared_limits import parse_limit
from celeryapp.errors import InvalidArgument
from celeryapp.execution.limit_slots import settle
from celeryapp.execution.limit_steps import admitted_steps, fail_waiters
from celeryapp.execution.limit_store import delete_limit as delete_stored
from celeryapp.execution.limit_store import limit_detail, limit_summaries, put_limit
from celeryapp.interfaces.arguments import actor_arg, flag_arg, name_arg, reason_arg
from celeryapp.states import AuditAction, AuditSource
from celeryapp.worker.dispatch import apply_effects
from models import transaction, utcnow
from models.session import retried_transaction

if TYPE_CHECKING:
    from celeryapp.application import ChordbeatCelery


def apply_limit(
    app: ChordbeatCelery,
    definition: Any,
    actor: Any = None,
    reason: Any = None,
    expected_version: Any = None,
    *,
    source: AuditSource = AuditSource.SERVICE,
) -> dict[str, Any]:
    """Create or change a limit; an invalid definition names every bad field and stores nothing.
    A change never pre-empts a holder; a limit made larger admits its waiters at once.
    ``expected_version`` (the ``version`` read; 0: none existed) refuses the change if the limit
    changed since, instead of overwriting that change with the fields as they were read."""
    limit = parse_limit(definition)
    who, why = actor_arg(actor, source), reason_arg(reason)
    if expected_version is not None:
        check_int(expected_version, "expected_version", InvalidArgument, low=0)

    def store(session: Session) -> tuple[dict[str, Any], Effects]:
        stored = put_limit(session, limit, expected_version=expected_version)
        admitted = Effects()
        if stored.changed:
            admitted = admitted_steps(session, settle(session, [stored.id]), now=utcnow())
            action = AuditAction.LIMIT_APPLIED
            detail = {"limit": limit.name, "created": stored.created, "definition": limit.to_json()}
            who.record(session, action, None, reason=why, detail=detail)
        return limit_detail(session, limit.name), admitted

    answer, admitted = retried_transaction(app.settings.database_url, f"applying limit {limit.name!r}", store)
    apply_effects(app, admitted)
    return answer


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

    def remove(session: Session) -> list[GroupDispatch]:
        deleted = delete_stored(session, name, force=forced)
        error = f"its limit {name!r} was deleted while it waited"
        failed = fail_waiters(session, deleted.dropped_waiters, error, now=utcnow())
        detail = {
            "limit": name,
            "force": forced,
            "held_slots": deleted.held_slots,
            "dropped_waiters": len(deleted.dropped_waiters),
        }
        who.record(session, AuditAction.LIMIT_DELETED, None, reason=why, detail=detail)
        return failed

    failed = retried_transaction(app.settings.database_url, f"deleting limit {name!r}", remove)
    apply_effects(app, Effects(dispatch=failed))
    return {"name": name, "deleted": True}
