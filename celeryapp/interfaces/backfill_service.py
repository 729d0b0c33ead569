"""The backfill service tasks: list and start the runs of a range of past slots, cancel them,
and read how far they got.

Every argument is checked before the transaction opens (anyone who can publish can call these);
each refusal names its argument. A dry run writes nothing.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from celeryapp.domain.backfill_slots import (
    BackfillBounds,
    Backlog,
    check_bounds,
    check_range,
    choose_slots,
    parse_max_concurrent,
    parse_mode,
    range_slots,
    request_key,
    time_arg,
    why_no_slots,
)
from celeryapp.domain.cadence import cadence_of
from celeryapp.domain.effects import Effects
from celeryapp.domain.times import iso
from celeryapp.errors import InvalidArgument, InvalidTransition, NotFound
from celeryapp.execution.backfills import cancel_backfill as cancel_in_db
from celeryapp.execution.backfills import (
    create_backfill,
    lock_backfill_totals,
    pending_slots,
    running_request,
    slot_facts,
    steps_per_run,
)
from celeryapp.interfaces.arguments import (
    actor_arg,
    execution_id_arg,
    flag_arg,
    limit_arg,
    name_arg,
    reason_arg,
    version_arg,
)
from celeryapp.interfaces.objects import backfill_json, schedule_backfills
from celeryapp.scheduling.calendar_files import excluded_slots
from celeryapp.scheduling.store import find_schedule
from celeryapp.states import AuditAction, AuditSource
from celeryapp.worker.dispatch import apply_effects
from models import BackfillOrigin, Overlap, ScheduleStatus, transaction, utcnow
from models.session import retried_transaction
from models.versions import definition_at

if TYPE_CHECKING:
    from celeryapp.application import ChordbeatCelery

#: Backfills a list shows at most.
MAX_BACKFILL_LIST_LIMIT = 500


def backfill_schedule(
    app: ChordbeatCelery,
    name: Any,
    start: Any,
    end: Any,
    mode: Any = "missing",
    max_concurrent: Any = 1,
    dry_run: Any = False,
    actor: Any = None,
    reason: Any = None,
    version: Any = None,
    *,
    source: AuditSource = AuditSource.SERVICE,
) -> dict[str, Any]:
    """The slots ``start ≤ slot < end`` the mode picks, oldest first; unless ``dry_run``, a backfill
    that runs them, ``max_concurrent`` at a time, with definition ``version`` (None: the current
    one when each run starts). The same request while its backfill runs answers with that backfill
    and starts nothing."""
    name = name_arg(name)
    since, until = time_arg("start", start), time_arg("end", end)
    chosen_mode = parse_mode(mode)
    concurrent = parse_max_concurrent(max_concurrent)
    dry = flag_arg(dry_run, "dry_run")
    who, why = actor_arg(actor, source), reason_arg(reason)
    pinned = None if version is None else version_arg(version)
    # Another version's backfill of the same range is another request.
    key = request_key(name, since, until, chosen_mode) + ("" if pinned is None else f":v{pinned}")
    settings = app.settings
    bounds = BackfillBounds(
        settings.backfill_max_pending_per_schedule, settings.backfill_max_pending, settings.backfill_max_step_runs
    )

    def plan(session: Session) -> tuple[dict[str, Any], Effects]:
        now = utcnow()
        check_range(since, until, now=now)
        schedule = find_schedule(session, name, lock=not dry)
        if pinned is not None and definition_at(session, schedule.id, pinned) is None:
            raise NotFound(f"schedule {name!r} has no version {pinned}")
        if concurrent > 1 and schedule.overlap is not Overlap.ALLOW:
            raise InvalidArgument(
                "max_concurrent",
                f"must be 1: schedule {name!r} has overlap {schedule.overlap.value!r}, so its runs never overlap",
            )
        if not dry:
            if schedule.status not in (ScheduleStatus.ACTIVE, ScheduleStatus.PAUSED):
                raise InvalidTransition(
                    f"schedule {name!r} is {schedule.status.value}; only an active or paused schedule can be backfilled"
                )
            same = running_request(session, key)
            if same is not None:
                return _answer(same.id, [datetime.fromisoformat(s) for s in same.slots]), Effects()
        cadence = cadence_of(schedule)
        in_range = range_slots(cadence, since, until)
        facts = slot_facts(session, schedule.id, since, until)
        chosen = choose_slots(in_range, chosen_mode, ran=facts.ran, latest_failed=facts.latest_failed, busy=facts.busy)
        reasons = excluded_slots(app.settings.calendars_dir, schedule.calendar, schedule.timezone, chosen)
        slots = [slot for slot, excluded in zip(chosen, reasons, strict=True) if excluded is None]
        if not slots:
            none_because = why_no_slots(cadence, chosen_mode, since, until, in_range=len(in_range), chosen=len(chosen))
            return _answer(None, [], none_because), Effects()
        # A dry run is refused as the request would be: the CLI asks with one before starting.
        if not dry:
            lock_backfill_totals(session)
        backlog = Backlog(
            pending_slots(session, schedule.id), pending_slots(session), steps_per_run(session, schedule.id)
        )
        check_bounds(name, len(slots), backlog, bounds)
        if dry:
            return _answer(None, slots), Effects()
        made = create_backfill(
            session,
            schedule,
            slots,
            origin=BackfillOrigin.REQUEST,
            max_concurrent=concurrent,
            now=now,
            actor=who.name,
            reason=why,
            mode=chosen_mode.value,
            request_key=key,
            span=(since, until),
            version=pinned,
        )
        detail: dict[str, Any] = {"backfill_id": made.backfill_id, "count": len(slots), "mode": chosen_mode.value}
        if pinned is not None:
            detail["version"] = pinned
        who.record(session, AuditAction.TRIGGER, name, reason=why, detail=detail, at=now)
        return _answer(made.backfill_id, slots), made.effects

    what = f"{'listing' if dry else 'starting'} a backfill of {name!r}"
    if dry:
        with transaction(app.settings.database_url, read_only=True) as session:
            answer, effects = plan(session)
    else:
        answer, effects = retried_transaction(app.settings.database_url, what, plan)
    apply_effects(app, effects)
    return answer


def _answer(backfill_id: int | None, slots: list[datetime], none_because: str | None = None) -> dict[str, Any]:
    """The contract's answer, with ``none_because``: why there is no slot to run (null when some)."""
    return {
        "backfill_id": backfill_id,
        "slots": [iso(slot) for slot in slots],
        "count": len(slots),
        "none_because": none_because,
    }


def _backfill_id(value: Any) -> int:
    return execution_id_arg(value, "backfill_id", "a backfill id")


def cancel_backfill(
    app: ChordbeatCelery,
    backfill_id: Any,
    actor: Any = None,
    reason: Any = None,
    *,
    source: AuditSource = AuditSource.SERVICE,
) -> dict[str, Any]:
    """Cancel the slots of the backfill that have not started; its runs in progress go on."""
    wanted = _backfill_id(backfill_id)
    who, why = actor_arg(actor, source), reason_arg(reason)

    def cancel(session: Session) -> dict[str, Any]:
        now = utcnow()
        backfill = cancel_in_db(session, wanted, now=now)
        if backfill is None:
            raise NotFound(f"backfill {wanted} does not exist")
        detail = {"backfill_id": wanted, "status": backfill.status.value}
        who.record(session, AuditAction.CANCEL, backfill.schedule_name, reason=why, detail=detail, at=now)
        session.flush()
        answer = backfill_json(session, wanted)
        assert answer is not None  # found under the schedule's lock a moment ago
        return answer

    return retried_transaction(app.settings.database_url, f"cancelling backfill {wanted}", cancel)


def get_backfill(app: ChordbeatCelery, backfill_id: Any) -> dict[str, Any]:
    wanted = _backfill_id(backfill_id)
    with transaction(app.settings.database_url, read_only=True) as session:
        backfill = backfill_json(session, wanted)
        if backfill is None:
            raise NotFound(f"backfill {wanted} does not exist")
        return backfill


def list_backfills(app: ChordbeatCelery, name: Any, limit: Any = 20) -> list[dict[str, Any]]:
    """The schedule's backfills (and catch-ups), newest first, as summaries (no slot lists); a
    deleted schedule's are kept."""
    name, limit = name_arg(name), limit_arg(limit, MAX_BACKFILL_LIST_LIMIT)
    with transaction(app.settings.database_url, read_only=True) as session:
        backfills = schedule_backfills(session, name, limit)
        if not backfills:
            find_schedule(session, name)
        return backfills
