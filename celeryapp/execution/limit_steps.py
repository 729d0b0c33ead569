"""Steps and the shared limits they use: slots taken when a step is dispatched, given back with
its attempt's outcome, and the steps a release admitted queued to be sent.

A step that uses limits takes their slots (:func:`celeryapp.execution.limit_slots.acquire_or_wait`)
in the transaction that queues it. Admitted, it is sent after commit as any step; not admitted, its
worker task is ``waiting_for_limit``: a row, holding no message, worker process or prefetch slot.
A release (an outcome, a lost attempt, a run's end) admits the next waiters in its transaction;
they are queued there and sent after commit. A process that dies in between leaves them queued
with no dispatch marker, which recovery sends again (the attempt's task id makes a second message
harmless: only one claim wins). A step using no limit takes none of these paths.

A step whose limit says ``on_full: skip`` is not run when it finds no room: its attempt is recorded
``complete_with_warning`` ("skipped: ..."), so the run goes on. A waiter that can never be
admitted (its limit shrank or was deleted), or whose key cannot be rendered from the run's payload,
fails. Either way the group is then advanced by a message (a dispatch with no steps).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, delete, insert, select, update
from sqlalchemy.orm import Session

from celeryapp.domain.definition import StepSpec
from celeryapp.domain.effects import Effects, GroupDispatch, LimitWake, StepDispatch
from celeryapp.domain.shared_limits import LimitDefinition, OnFull, parse_limit
from celeryapp.errors import ChordbeatError, InvalidArgument, NotFound
from celeryapp.execution.limit_slots import Admitted, Demand, Holder, acquire_or_wait, release
from models import ActivityStatus, WorkerTaskStatus
from models.limit_tables import LIMIT_HOLDS, LIMIT_WAITERS, LIMITS
from models.session import affected
from models.tables import ACTIVITIES, EXECUTIONS, WORKER_TASKS

logger = logging.getLogger(__name__)

_task = WORKER_TASKS.c


def plan_uses_limits(plan: Iterable[Iterable[Mapping[str, Any]]]) -> bool:
    """Whether any step of a run's plan uses a limit (read off the plan: no query)."""
    return any("uses" in step for group in plan for step in group)


def gate_group(conn: Connection | Session, group: GroupDispatch, *, now: datetime) -> Effects:
    """In the transaction that queued ``group``'s attempts: each step that uses limits takes their
    slots, or waits (its task ``waiting_for_limit``), or is skipped or failed. What to send after
    commit: the group with the steps that may run, the steps other passes admitted, and the
    passes due later (a waiter's rate token)."""
    if not any(step.spec.uses for step in group.steps):
        return Effects(dispatch=[group])
    session = conn if isinstance(conn, Session) else Session(bind=conn)
    payload: dict[str, Any] = dict(
        session.scalar(select(EXECUTIONS.c.payload).where(EXECUTIONS.c.id == group.execution_id)) or {}
    )
    names = {use.limit for step in group.steps for use in step.spec.uses}
    limits = {
        d["name"]: parse_limit(d) for d in session.scalars(select(LIMITS.c.definition).where(LIMITS.c.name.in_(names)))
    }
    send: list[StepDispatch] = []
    after = Effects()
    for step in group.steps:
        if not step.spec.uses:
            send.append(step)
            continue
        holder = Holder(step.worker_task_id, step.attempt, step.execution_id, step.spec.name)
        try:
            demands = _demands(step.spec, limits, payload, group.schedule_name)
            held, admitted = acquire_or_wait(session, demands, holder, now=now)
        except (NotFound, InvalidArgument) as exc:
            # An unknown limit (deleted since the definition was applied), a key the payload cannot
            # make, a use that can never fit: the step fails, it does not wait for ever.
            after.dispatch += _end_unstarted(
                session, holder, group.step_index, ActivityStatus.FAILED_WITH_ERROR, str(exc), now
            )
            continue
        after.merge(admitted_steps(session, admitted, now=now))
        if held:
            send.append(step)
        elif any(limits[use.limit].on_full is OnFull.SKIP for use in step.spec.uses):
            released = release(session, holder.worker_task_id, holder.attempt, now=now)
            after.merge(admitted_steps(session, released.admitted, now=now))
            text = f"skipped: {', '.join(_full(session, step.spec))} full (on_full: skip)"
            status = ActivityStatus.COMPLETE_WITH_WARNING
            after.dispatch += _end_unstarted(session, holder, group.step_index, status, text, now)
        else:
            _to_waiting(session, holder)
    after.dispatch[:0] = [replace(group, steps=tuple(send))] if send else []
    return after


def _demands(
    spec: StepSpec, limits: Mapping[str, LimitDefinition], payload: Mapping[str, Any], schedule: str
) -> list[Demand]:
    demands = []
    for use in spec.uses:
        limit = limits.get(use.limit)
        if limit is None:
            raise NotFound(f"limit {use.limit!r} does not exist (deleted since the schedule was applied)")
        key = "" if limit.key is None else limit.key.render(payload=payload, schedule=schedule, step=spec.name)
        demands.append(Demand(use.limit, key, use.slots))
    return demands


def _full(session: Session, spec: StepSpec) -> list[str]:
    rows = session.execute(
        select(LIMITS.c.name, LIMITS.c.in_use, LIMITS.c.slots).where(LIMITS.c.name.in_([u.limit for u in spec.uses]))
    ).all()
    return [f"{name} {in_use}/{slots}" for name, in_use, slots in sorted(rows)]


def _to_waiting(session: Session, holder: Holder) -> None:
    waiting = (
        update(WORKER_TASKS)
        .where(
            _task.id == holder.worker_task_id, _task.attempt == holder.attempt, _task.status == WorkerTaskStatus.QUEUED
        )
        .values(status=WorkerTaskStatus.WAITING_FOR_LIMIT, queued_at=None)
    )
    if affected(session, waiting) != 1:
        raise ChordbeatError(f"worker task {holder.worker_task_id} attempt {holder.attempt} was not queued")


def admitted_steps(session: Session, admitted: Admitted, *, now: datetime) -> Effects:
    """The waiters a pass admitted, queued (their slots held) and returned to be sent after
    commit; those it found impossible, failed; the passes due later (a rate's next token, a limit
    the pass could not lock). A waiter whose task is gone (its run ended) gives its slots straight
    back, admitting the next."""
    after: list[GroupDispatch] = []
    wakes = limit_wakes(admitted, now)
    todo = list(admitted.started)
    impossible = list(admitted.impossible)
    while todo or impossible:
        if impossible:
            holder = impossible.pop(0)
            step_index = session.scalar(select(_task.step_index).where(*_waiting(holder)))
            if step_index is not None:
                error = "its limits can no longer give the slots it needs (made smaller, or deleted)"
                after += _end_unstarted(session, holder, step_index, ActivityStatus.FAILED_WITH_ERROR, error, now)
            continue
        holder = todo.pop(0)
        queued = session.execute(
            update(WORKER_TASKS)
            .where(*_waiting(holder))
            .values(status=WorkerTaskStatus.QUEUED, queued_at=now)
            .returning(_task.step_index)
        ).first()
        if queued is None:
            released = release(session, holder.worker_task_id, holder.attempt, now=now)
            todo += released.admitted.started
            impossible += released.admitted.impossible
            wakes += limit_wakes(released.admitted, now)
            continue
        run = session.execute(
            select(EXECUTIONS.c.token, EXECUTIONS.c.plan, EXECUTIONS.c.schedule_name).where(
                EXECUTIONS.c.id == holder.execution_id
            )
        ).one()
        spec = next(StepSpec.from_json(s) for s in run.plan[queued.step_index] if s["name"] == holder.step_name)
        step = StepDispatch(holder.execution_id, holder.worker_task_id, holder.attempt, spec, run.token)
        after.append(
            GroupDispatch(
                holder.execution_id, queued.step_index, (step,), requeue=True, schedule_name=run.schedule_name
            )
        )
        logger.info("step %r of execution %s admitted by its limits", holder.step_name, holder.execution_id)
    return Effects(dispatch=after, limit_wakes=wakes)


def limit_wakes(admitted: Admitted, now: datetime) -> list[LimitWake]:
    """The passes a pass leaves to do: when a waiter held back by a rate gets its token (over the
    limits it decided on), and at once over the limits it could not lock for a waiter."""
    wakes = []
    if admitted.wake_at is not None and admitted.decided:
        wakes.append(LimitWake(tuple(sorted(admitted.decided)), admitted.wake_at))
    if admitted.recheck:
        wakes.append(LimitWake(tuple(sorted(admitted.recheck)), now))
    return wakes


def _waiting(holder: Holder) -> tuple[Any, ...]:
    return (
        _task.id == holder.worker_task_id,
        _task.attempt == holder.attempt,
        _task.status == WorkerTaskStatus.WAITING_FOR_LIMIT,
    )


def _end_unstarted(
    session: Session, holder: Holder, step_index: int, status: ActivityStatus, text: str, now: datetime
) -> list[GroupDispatch]:
    """A step that never started ends (skipped or failed): its attempt recorded, its task deleted,
    and its group advanced by a message (nothing else would, should it be the group's last)."""
    gone = delete(WORKER_TASKS).where(_task.id == holder.worker_task_id, _task.attempt == holder.attempt)
    if not affected(session, gone):
        return []
    failed = status.failed
    session.execute(
        insert(ACTIVITIES).values(
            execution_id=holder.execution_id,
            step_index=step_index,
            step_name=holder.step_name,
            attempt=holder.attempt,
            status=status,
            started_at=now,
            completed_at=now,
            error=text if failed else None,
            message=None if failed else text,
        )
    )
    log = logger.warning if failed else logger.info
    log("step %r of execution %s not run: %s", holder.step_name, holder.execution_id, text)
    return [GroupDispatch(holder.execution_id, step_index, ())]


def release_attempt(conn: Connection | Session, worker_task_id: int, attempt: int, *, now: datetime) -> Effects:
    """Give back what an attempt holds (or drop its waits), in the transaction that records its
    outcome or its loss; what to send after commit (the waiters admitted)."""
    session = conn if isinstance(conn, Session) else Session(bind=conn)
    released = release(session, worker_task_id, attempt, now=now)
    return admitted_steps(session, released.admitted, now=now)


def run_attempts(
    session: Session, execution_id: int, plan: Sequence[Sequence[Mapping[str, Any]]]
) -> list[tuple[int, int]]:
    """The attempts of a run that may hold or wait for slots (none read when its plan uses no limit)."""
    if not plan_uses_limits(plan):
        return []
    rows = session.execute(
        select(_task.id, _task.attempt).where(_task.execution_id == execution_id).order_by(_task.id)
    ).all()
    return [(task_id, attempt) for task_id, attempt in rows]


def release_attempts(session: Session, attempts: Iterable[tuple[int, int]], *, now: datetime) -> Effects:
    """:func:`release_attempt` for each of a run's attempts as the run ends."""
    after = Effects()
    for task_id, attempt in attempts:
        after.merge(release_attempt(session, task_id, attempt, now=now))
    return after


def waiting_for(session: Session, worker_task_ids: Sequence[int]) -> dict[int, str]:
    """Why each of these tasks waits: the limits it waits for with what they hold and who holds
    them, ``"warehouse 3/3 (held by #17 load, #19 export)"`` (the contract's ``waiting_for``)."""
    if not worker_task_ids:
        return {}
    rows = session.execute(
        select(LIMIT_WAITERS.c.worker_task_id, LIMITS.c.id, LIMITS.c.name, LIMITS.c.in_use, LIMITS.c.slots)
        .join(LIMITS, LIMITS.c.id == LIMIT_WAITERS.c.limit_id)
        .where(LIMIT_WAITERS.c.worker_task_id.in_(worker_task_ids))
        .order_by(LIMIT_WAITERS.c.worker_task_id, LIMITS.c.name)
    ).all()
    held_by = {limit_id: _held_by(session, limit_id) for limit_id in sorted({row.id for row in rows})}
    why: dict[int, list[str]] = {}
    for task_id, limit_id, name, in_use, slots in rows:
        holders = f" (held by {held_by[limit_id]})" if held_by[limit_id] else ""
        why.setdefault(task_id, []).append(f"{name} {in_use}/{slots}{holders}")
    return {task_id: ", ".join(parts) for task_id, parts in why.items()}


#: Holders named beside a waiting step, the longest-held first; a limit of 10,000 slots is not
#: listed whole (its Limits page lists them).
NAMED_HOLDERS = 3


def _held_by(session: Session, limit_id: int) -> str:
    """``"#17 load, #19 export"``: the runs and steps holding the limit, ``and more`` past a few
    (the first entries of the holds' (limit, since) index)."""
    holds = session.execute(
        select(LIMIT_HOLDS.c.execution_id, LIMIT_HOLDS.c.step_name)
        .where(LIMIT_HOLDS.c.limit_id == limit_id)
        .order_by(LIMIT_HOLDS.c.since, LIMIT_HOLDS.c.id)
        .limit(NAMED_HOLDERS + 1)
    ).all()
    named = ", ".join(f"#{execution_id} {step}" for execution_id, step in holds[:NAMED_HOLDERS])
    return named + (" and more" if len(holds) > NAMED_HOLDERS else "")


def fail_waiters(
    session: Session, attempts: Iterable[tuple[int, int]], error: str, *, now: datetime
) -> list[GroupDispatch]:
    """Fail the steps whose waits were dropped (their limit deleted with force): they would
    otherwise wait for ever. What to send after commit (their groups' advancement)."""
    after: list[GroupDispatch] = []
    for task_id, attempt in attempts:
        row = session.execute(
            select(_task.execution_id, _task.step_index, _task.step_name).where(
                _task.id == task_id, _task.attempt == attempt, _task.status == WorkerTaskStatus.WAITING_FOR_LIMIT
            )
        ).first()
        if row is not None:
            holder = Holder(task_id, attempt, row.execution_id, row.step_name)
            after += _end_unstarted(session, holder, row.step_index, ActivityStatus.FAILED_WITH_ERROR, error, now)
    return after
