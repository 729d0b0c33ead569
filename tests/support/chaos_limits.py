"""Shared limits under chaos: a sampler that reads every limit's holds and waiters from the database
every 100 ms while the plan plays, and the invariants checked from what it saw and from the end state.

Invariants (each a :class:`tests.support.chaos_invariants.Violation`):

- **In use never above slots.** At every sample, per limit, neither ``in_use`` nor the slots its
  holds add up to is above ``slots``, and per key, the holds' slots are not above
  ``per_key_slots``; ``in_use`` equals the holds' sum (a counter that drifts from its holds is a
  slot leaked or given twice). The worst seen is reported per limit and per key. The step log
  says the same of bodies: those of steps using a limit never run more at once than its slots
  (a body counts while its worker is not SIGSTOPped, and a fenced one may run on
  :data:`tests.support.chaos_invariants.WAKE_TOLERANCE_S` once its worker wakes, as for
  "no step body runs twice at once").
- **No slot held by an attempt that has ended.** At every sample and at the end: no hold whose
  worker task is gone, is at another attempt (the hold's attempt fenced or superseded), waits for
  a limit, or whose execution has ended. No waiter of such an attempt either. After settling,
  no hold and no waiter is left and every limit's ``in_use`` is 0.
- **No waiter stuck.** A waiter that could be admitted (every limit it waits for has room for its
  slots, per key too, and it heads its queue) is admitted by the transaction that made the room,
  or by recovery's pass: one that could for more than :data:`ROOM_WAIT_S` outside a fault's
  recovery window (:data:`tests.support.chaos_invariants.STALL_AFTER_S`) is stuck. Once the
  schedules are paused every waiter is admitted or ends with its run (the end state above).

Measured: the admissions (acquire/release cycles: ``chordbeat_limit_admitted_total``'s rows), the
most in use seen per limit and per key against the slots, and for each SIGKILLed or frozen worker
how long its holds stayed after the fault began (the slot's cost of a crash: the heartbeat TTL
and a recovery pass).
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.exc import DBAPIError

from celeryapp.monitoring.metric_counts import LIMIT_ADMITTED
from celeryapp.states import ExecutionStatus, WorkerTaskStatus
from models import MetricCount, transaction
from models.limit_tables import LIMIT_HOLDS, LIMIT_WAITERS, LIMITS
from models.tables import EXECUTIONS, WORKER_TASKS
from tests.support.chaos import Applied
from tests.support.chaos_invariants import (
    STALL_AFTER_S,
    WAKE_TOLERANCE_S,
    BodyRun,
    Context,
    Violation,
    _merged,
    window_s,
)

#: Seconds between two samples.
SAMPLE_S = 0.1
#: Seconds a waiter that could be admitted may stay waiting outside faults' recovery windows:
#: recovery's pass (every second in the chaos cluster) admits one a lost admission left behind.
ROOM_WAIT_S = 5.0

#: The chaos load's limits: a small one every schedule's busiest steps share, and one per key
#: (the schedule's name) that lets each schedule hold one slot at a time.
CHAOS_LIMITS: list[dict[str, Any]] = [
    {"name": "chaos-pool", "slots": 2},
    {"name": "chaos-keyed", "slots": 3, "key": "{schedule}", "per_key_slots": 1},
]


@dataclass
class HoldSeen:
    """A hold (worker task, attempt, limit) across the samples that saw it."""

    first: float
    last: float
    node: str | None
    limit: str


@dataclass
class LimitSamples:
    """What the sampler saw: the worst per limit and per key, and the violations with their times."""

    samples: int = 0
    errors: int = 0
    #: How many samples failed, by the error's first words (a database away, or a bug of the sampler).
    error_kinds: Counter[str] = field(default_factory=Counter)
    slots: dict[str, int] = field(default_factory=dict)
    per_key_slots: dict[str, int | None] = field(default_factory=dict)
    max_in_use: dict[str, int] = field(default_factory=dict)
    max_per_key: dict[str, int] = field(default_factory=dict)
    max_waiting: dict[str, int] = field(default_factory=dict)
    holds: dict[tuple[int, int, int], HoldSeen] = field(default_factory=dict)
    #: (when, what) for each state a sample found wrong (once per hold, waiter or limit and kind).
    found: list[tuple[float, str, str]] = field(default_factory=list)
    _reported: set[tuple[Any, ...]] = field(default_factory=set)
    #: Waiter (worker task, attempt) -> since when it could have been admitted, continuously.
    room_since: dict[tuple[int, int], float] = field(default_factory=dict)
    #: Each continuous spell a waiter could have been admitted: (from, to, waiter).
    room_spells: list[tuple[float, float, str]] = field(default_factory=list)

    def report(self, at: float, invariant: str, key: tuple[Any, ...], detail: str) -> None:
        if key not in self._reported:
            self._reported.add(key)
            self.found.append((at, invariant, detail))


class LimitSampler:
    """Reads the limits' state every :data:`SAMPLE_S` in a thread of the test process, in one
    snapshot each time (REPEATABLE READ on PostgreSQL, a read transaction on SQLite's WAL)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.seen = LimitSamples()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-limit-sampler", daemon=True)

    def __enter__(self) -> LimitSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                rows = self.read()
            except DBAPIError as exc:  # the database is down or restarting: the next sample tries again
                self.seen.errors += 1
                self.seen.error_kinds[f"{type(exc.orig).__name__}: {str(exc.orig)[:120]}"] += 1
            else:
                try:
                    self.judge(time.time(), *rows)
                except Exception as exc:  # a bug of the checks: it fails the plan, not hides
                    detail = f"judging a sample raised {type(exc).__name__}: {exc}"
                    self.seen.report(time.time(), "the limit sampler works", ("judge", detail), detail)
            self._stop.wait(max(0.0, SAMPLE_S - (time.monotonic() - began)))

    def sample(self) -> None:
        self.judge(time.time(), *self.read())

    def read(self) -> tuple[list[Any], list[Any], list[Any]]:
        """The limits, the holds and the waiters, with their owners' state, in one snapshot."""
        with transaction(self.url, read_only=True) as session:
            if session.get_bind().dialect.name == "postgresql":
                session.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
            limits = session.execute(
                select(LIMITS.c.id, LIMITS.c.name, LIMITS.c.slots, LIMITS.c.per_key_slots, LIMITS.c.in_use)
            ).all()
            holds = session.execute(_with_owner(LIMIT_HOLDS, LIMIT_HOLDS.c.key, LIMIT_HOLDS.c.slots)).all()
            waiters = session.execute(
                _with_owner(
                    LIMIT_WAITERS,
                    LIMIT_WAITERS.c.key,
                    LIMIT_WAITERS.c.slots,
                    LIMIT_WAITERS.c.queue,
                    LIMIT_WAITERS.c.turn,
                    LIMIT_WAITERS.c.id,
                )
            ).all()
        return list(limits), list(holds), list(waiters)

    def judge(self, now: float, limits: Iterable[Any], holds: Iterable[Any], waiters: Iterable[Any]) -> None:
        seen = self.seen
        seen.samples += 1
        by_id = {row.id: row for row in limits}
        held: dict[int, int] = defaultdict(int)
        per_key: dict[tuple[int, str], int] = defaultdict(int)
        for h in holds:
            held[h.limit_id] += h.slots
            per_key[(h.limit_id, h.key)] += h.slots
            limit = by_id[h.limit_id].name if h.limit_id in by_id else str(h.limit_id)
            ident = (h.worker_task_id, h.attempt, h.limit_id)
            if ident in seen.holds:
                seen.holds[ident].last = now
                # Held from dispatch; its node is known from the claim on.
                seen.holds[ident].node = h.node or seen.holds[ident].node
            else:
                seen.holds[ident] = HoldSeen(now, now, h.node, limit)
            ended = _ended(h, WorkerTaskStatus.WAITING_FOR_LIMIT, WorkerTaskStatus.WAITING)
            if ended:
                seen.report(
                    now,
                    "no slot held by an attempt that has ended",
                    ("hold", *ident),
                    f"{limit}: a slot held by {h.step_name!r} attempt {h.attempt} of execution {h.execution_id} "
                    f"(worker task {h.worker_task_id}): {ended}",
                )
        for limit_id, row in by_id.items():
            seen.slots[row.name] = row.slots
            seen.per_key_slots[row.name] = row.per_key_slots
            in_use = max(row.in_use, held[limit_id])
            seen.max_in_use[row.name] = max(seen.max_in_use.get(row.name, 0), in_use)
            if in_use > row.slots:
                seen.report(
                    now,
                    "in use never above slots",
                    ("over", limit_id, in_use),
                    f"{row.name}: {in_use} in use (in_use {row.in_use}, holds {held[limit_id]}) of {row.slots} slots",
                )
            if row.in_use != held[limit_id]:
                seen.report(
                    now,
                    "in use never above slots",
                    ("drift", limit_id, row.in_use, held[limit_id]),
                    f"{row.name}: in_use says {row.in_use}, its holds add up to {held[limit_id]}",
                )
        for (limit_id, key), slots in per_key.items():
            row = by_id.get(limit_id)
            if row is None or row.per_key_slots is None:
                continue
            seen.max_per_key[row.name] = max(seen.max_per_key.get(row.name, 0), slots)
            if slots > row.per_key_slots:
                seen.report(
                    now,
                    "in use never above slots",
                    ("over-key", limit_id, key, slots),
                    f"{row.name}: key {key!r} holds {slots} of its {row.per_key_slots} slots",
                )
        self._judge_waiters(now, by_id, held, per_key, list(waiters))

    def _judge_waiters(
        self,
        now: float,
        by_id: Mapping[int, Any],
        held: Mapping[int, int],
        per_key: Mapping[tuple[int, str], int],
        waiters: list[Any],
    ) -> None:
        seen = self.seen
        count: dict[str, int] = defaultdict(int)
        heads: dict[tuple[int, str], tuple[int, int]] = {}
        for w in waiters:
            spot = (w.limit_id, w.queue)
            heads[spot] = min(heads.get(spot, (w.turn, w.id)), (w.turn, w.id))
        fits: dict[tuple[int, int], bool] = {}
        for w in waiters:
            row = by_id.get(w.limit_id)
            name = row.name if row is not None else str(w.limit_id)
            count[name] += 1
            waiter = (w.worker_task_id, w.attempt)
            ended = _ended(w, WorkerTaskStatus.QUEUED, WorkerTaskStatus.PROCESSING, WorkerTaskStatus.WAITING)
            if ended:
                seen.report(
                    now,
                    "no waiter stuck",
                    ("waiter", *waiter, w.limit_id),
                    f"{name}: {w.step_name!r} attempt {w.attempt} of execution {w.execution_id} waits, but {ended}",
                )
            room = (
                row is not None
                and held.get(w.limit_id, 0) + w.slots <= row.slots
                and (row.per_key_slots is None or per_key.get((w.limit_id, w.key), 0) + w.slots <= row.per_key_slots)
                and heads[(w.limit_id, w.queue)] == (w.turn, w.id)
            )
            fits[waiter] = fits.get(waiter, True) and room
        for name, n in count.items():
            seen.max_waiting[name] = max(seen.max_waiting.get(name, 0), n)
        for waiter, fit in fits.items():
            since = seen.room_since.get(waiter)
            if fit and since is None:
                seen.room_since[waiter] = now
            elif not fit and since is not None:
                self._close_spell(waiter, now)
        for waiter in [w for w in seen.room_since if w not in fits]:
            self._close_spell(waiter, now)

    def _close_spell(self, waiter: tuple[int, int], now: float) -> None:
        since = self.seen.room_since.pop(waiter)
        self.seen.room_spells.append((since, now, f"worker task {waiter[0]} attempt {waiter[1]}"))

    def close(self, now: float) -> None:
        for waiter in list(self.seen.room_since):
            self._close_spell(waiter, now)


def _with_owner(table: Any, *columns: Any) -> Any:
    """A hold's or waiter's rows with its worker task's attempt, status and node and its execution's status."""
    return select(
        table.c.worker_task_id,
        table.c.attempt,
        table.c.limit_id,
        table.c.execution_id,
        table.c.step_name,
        *columns,
        WORKER_TASKS.c.id.label("task_id"),
        WORKER_TASKS.c.attempt.label("task_attempt"),
        WORKER_TASKS.c.status.label("task_status"),
        WORKER_TASKS.c.node,
        EXECUTIONS.c.status.label("execution_status"),
    ).select_from(
        table.outerjoin(WORKER_TASKS, WORKER_TASKS.c.id == table.c.worker_task_id).outerjoin(
            EXECUTIONS, EXECUTIONS.c.id == table.c.execution_id
        )
    )


def _ended(row: Any, *wrong: WorkerTaskStatus) -> str:
    """Why the attempt of a hold's or waiter's ``row`` is over ("" if it is not)."""
    if row.execution_status is None or ExecutionStatus(row.execution_status) is not ExecutionStatus.IN_PROGRESS:
        return f"its execution is {row.execution_status}"
    if row.task_id is None:
        return "its worker task is gone"
    if row.task_attempt != row.attempt:
        return f"its worker task is at attempt {row.task_attempt}"
    status = WorkerTaskStatus(row.task_status)
    if status in wrong:
        return f"its worker task is {status.value}"
    return ""


def admissions(url: str) -> int:
    """Admissions to any limit so far: acquire/release cycles (each admitted hold is released)."""
    with transaction(url, read_only=True) as session:
        total = session.scalar(select(func.sum(MetricCount.count)).where(MetricCount.metric == LIMIT_ADMITTED))
    return int(total or 0)


def end_state(url: str) -> tuple[list[str], list[str], dict[str, int]]:
    """After settling: the holds and waiters left (descriptions) and each limit's ``in_use``."""
    with transaction(url, read_only=True) as session:
        holds = session.execute(select(LIMIT_HOLDS)).all()
        waiters = session.execute(select(LIMIT_WAITERS)).all()
        in_use = {row.name: row.in_use for row in session.execute(select(LIMITS.c.name, LIMITS.c.in_use))}
    describe = "{0.step_name!r} attempt {0.attempt} of execution {0.execution_id} (limit {0.limit_id}, key {0.key!r})"
    return [describe.format(h) for h in holds], [describe.format(w) for w in waiters], in_use


def check_limits(
    ctx: Context, seen: LimitSamples, url: str, definitions: list[dict[str, Any]]
) -> tuple[list[Violation], dict[str, Any]]:
    """The limit invariants from the samples, the end state and the step log; and the figures."""
    out = [Violation(invariant, f"{detail} at {ctx.rel(at)}; {ctx.near(at)}") for at, invariant, detail in seen.found]
    holds, waiters, in_use = end_state(url)
    ended = "no slot held by an attempt that has ended"
    out += [Violation(ended, f"after settling, a slot held by {h}") for h in holds]
    out += [Violation("no waiter stuck", f"after settling, {w} still waits") for w in waiters]
    out += [Violation(ended, f"after settling, {name}'s in_use is {n}") for name, n in in_use.items() if n]
    stuck, longest_room = stuck_waiters(ctx, seen.room_spells)
    out += stuck
    body_violations, max_bodies = check_bodies_within_slots(ctx, definitions)
    out += body_violations
    stats = {
        "limit_samples": seen.samples,
        "limit_sample_errors": seen.errors,
        "limit_sample_error_kinds": dict(seen.error_kinds.most_common(5)),
        "limit_cycles": admissions(url),
        "limit_slots": dict(seen.slots),
        "limit_max_in_use": dict(seen.max_in_use),
        "limit_per_key_slots": dict(seen.per_key_slots),
        "limit_max_per_key": dict(seen.max_per_key),
        "limit_max_waiting": dict(seen.max_waiting),
        "limit_max_bodies_at_once": max_bodies,
        "limit_leaked_slots": len(holds) + sum(in_use.values()),
        "limit_waiters_left": len(waiters),
        "limit_longest_wait_with_room_s": round(longest_room, 2),
        "crashed_holder_release_s": crashed_holder_release_s(ctx.applied, seen),
    }
    return out, stats


def stuck_waiters(ctx: Context, spells: list[tuple[float, float, str]]) -> tuple[list[Violation], float]:
    """The waiters that could have been admitted for longer than :data:`ROOM_WAIT_S` outside
    faults' recovery windows, and the longest such wait seen."""
    windows = [(a, window_s(STALL_AFTER_S, a.fault)) for a in ctx.applied]
    excused = _merged([(a.started - 0.5, a.ended + after) for a, after in windows if after is not None])
    out, longest = [], 0.0
    for lo, hi, who in spells:
        outside = (hi - lo) - sum(max(0.0, min(hi, w_hi) - max(lo, w_lo)) for w_lo, w_hi in excused)
        longest = max(longest, outside)
        if outside > ROOM_WAIT_S:
            out.append(
                Violation(
                    "no waiter stuck",
                    f"{who} could have been admitted from {ctx.rel(lo)} to {ctx.rel(hi)} "
                    f"({outside:.1f}s outside fault recovery windows) and waited; {ctx.near(lo)}",
                )
            )
    return out, longest


def crashed_holder_release_s(applied: list[Applied], seen: LimitSamples) -> list[dict[str, Any]]:
    """For each SIGKILLed or SIGSTOPped worker that held slots: from the fault to its last hold's
    release (as sampled: at most :data:`SAMPLE_S` late)."""
    out = []
    for a in applied:
        if a.fault.kind not in ("worker_kill", "worker_stop"):
            continue
        node = f"{a.fault.target}@"
        caught = [h for h in seen.holds.values() if (h.node or "").startswith(node) and h.first <= a.started <= h.last]
        if caught:
            took = max(h.last for h in caught) - a.started + SAMPLE_S
            out.append({"fault": a.fault.kind, "holds": len(caught), "released_after_s": round(took, 2)})
    return out


def _uses(spec: Mapping[str, Any]) -> list[tuple[str, int]]:
    return [(u, 1) if isinstance(u, str) else (u["limit"], int(u.get("slots", 1))) for u in spec.get("uses") or ()]


def check_bodies_within_slots(
    ctx: Context, definitions: list[dict[str, Any]]
) -> tuple[list[Violation], dict[str, int]]:
    """No more bodies of steps using a limit run at once than its slots (per key too), for longer
    than :data:`WAKE_TOLERANCE_S` (a fenced body stopping once its frozen worker wakes, times
    written by two processes). A body counts while its worker is not SIGSTOPped."""
    limits = {d["name"]: d for d in definitions}
    events: dict[tuple[str, str], list[tuple[float, int]]] = defaultdict(list)
    for run in ctx.runs:
        e = ctx.execution_of.get(run.execution_id)
        spec = next((s for group in e.plan for s in group if s["name"] == run.step), None) if e else None
        if e is None or spec is None:
            continue
        pieces = _running_pieces(ctx, run)
        for name, slots in _uses(spec):
            template = limits.get(name, {}).get("key", "")
            key = template.replace("{schedule}", e.schedule_name).replace("{step}", run.step)
            for spot in ((name, ""), (name, key)) if key else ((name, ""),):
                for lo, hi in pieces:
                    events[spot] += [(lo, slots), (hi, -slots)]
    out: list[Violation] = []
    most: dict[str, int] = {}
    spells: list[float] = []
    for (name, key), moments in events.items():
        bound = limits[name]["per_key_slots"] if key else limits[name]["slots"]
        label = f"{name}[{key}]" if key else name
        most[label], over = _most_at_once(ctx, label, bound, moments, out)
        spells += over
    whole = {label: n for label, n in sorted(most.items()) if "[" not in label}
    per_key = max((n for label, n in most.items() if "[" in label), default=0)
    # The spells above the slots within the tolerance: how many, and the longest.
    longest_ms = round(max(spells, default=0.0) * 1000)
    return out, {**whole, "per_key": per_key, "spells_over": len(spells), "longest_over_ms": longest_ms}


def _running_pieces(ctx: Context, run: BodyRun) -> list[tuple[float, float]]:
    """The spans of ``run``'s body while its worker was not SIGSTOPped."""
    end, _ = ctx.body_end(run)
    frozen = _merged(
        [(a.started, a.ended or end) for a in ctx.applied if a.fault.kind == "worker_stop" and a.pid == run.ppid]
    )
    pieces, cursor = [], run.start
    for lo, hi in frozen:
        if hi <= cursor or lo >= end:
            continue
        if lo > cursor:
            pieces.append((cursor, lo))
        cursor = max(cursor, hi)
    if end > cursor:
        pieces.append((cursor, end))
    return pieces


def _most_at_once(
    ctx: Context, label: str, bound: int, moments: list[tuple[float, int]], out: list[Violation]
) -> tuple[int, list[float]]:
    """The most slots ``moments`` (starts +slots, ends -slots) held at once, and how long each
    spell above ``bound`` lasted; each one longer than the tolerance appended to ``out``."""
    level, most, over_since, worst = 0, 0, None, 0
    spells: list[float] = []
    # Ends before starts at one instant: a body handing its slot on is not two at once.
    for at, change in sorted(moments):
        level += change
        most = max(most, level)
        if level > bound:
            over_since, worst = (at if over_since is None else over_since), max(worst, level)
        elif over_since is not None:
            spells.append(at - over_since)
            if at - over_since > WAKE_TOLERANCE_S:
                out.append(
                    Violation(
                        "in use never above slots",
                        f"{label}: {worst} bodies using it ran at once from {ctx.rel(over_since)} for "
                        f"{at - over_since:.1f}s ({bound} slots); {ctx.near(over_since)}",
                    )
                )
            over_since, worst = None, 0
    return most, spells
