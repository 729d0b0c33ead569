"""The chaos suite's invariants, checked from the database and the step log after the system settled.

Each check returns the violations it found (it never stops at the first), each naming the fault
nearest in time, so a failing plan says what broke and under which fault.

Rules that need a precise reading:

- **A body's interval.** A step log ``start`` without an ``end`` ran until its worker died (the
  harness's SIGKILL time, or the time the supervisor saw it exit) or its pool process did (the
  time the supervisor saw it gone: the worker lives on and replaces it), else until its activity was
  closed (unless that close was recovery's "worker lost", which says nothing about the body),
  else until the end of the test. A body does not run while its worker is SIGSTOPped (a frozen
  process executes nothing): that time is not counted when two attempts' intervals overlap, nor
  after the next group started. Once its worker wakes, a body fenced meanwhile must stop within
  :data:`WAKE_TOLERANCE_S` (its watch looks at the fence at once, then the interrupt lands).
- **Vanished slots.** For each schedule, every nominal slot from its first recorded slot to the
  last slot due at least 1.5 s before its schedule was paused for settling must have an
  execution (run key) or a slot record. No make-up runs means slots may pass without a record only
  while firing was impossible: inside a *blackout* of a beat, Redis or database fault, from 0.5 s
  before the fault to an allowance after it ends (beat killed or Redis back with its data: 40 s,
  as beat may wait for RedBeat's 30 s lock to expire before it fires again; Redis back empty:
  10 s; beat SIGSTOPped: 8 s; database: 10 s), and after the failure that left its schedule dead
  (nothing of it fires any more). A slot due while a retry was pending is recorded ``retry``, by
  its own fire or by the retry's. Worker faults excuse nothing: a fire message lost with a
  SIGKILLed worker is a lost slot. Whether the latest
  missed slot ran after a blackout is not asserted (the lost-fire re-fire only covers a slot no
  later fire superseded); the report counts excused slots and late slot records.
- **Stalls.** An in-progress execution may run no step body for at most 15 s, not counting
  time inside a fault's recovery window (:data:`STALL_AFTER_S` after it ends: worker faults 10 s,
  beat killed or Redis back with its data 40 s, Redis back empty 15 s, beat SIGSTOPped 8 s,
  database 10 s). An execution timeout ending a stranded run does not hide it.
- **Nothing after final.** No activity opened after its execution ended (by more than
  :data:`CLOCK_SLACK_S`: two processes' readings of the reference clock), none closed more than
  2 s after it (timestamps are taken before commit: a recovery pass's clock can lag its writes),
  no step body started more than 2 s after its execution ended.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select

from celeryapp.clock import MAX_ROUND_TRIP_S
from models import (
    Activity,
    ActivityStatus,
    ExecutionStatus,
    Schedule,
    ScheduleExecution,
    ScheduleStatus,
    SlotOutcome,
    SlotRecord,
    Trigger,
    WorkerTask,
    transaction,
)
from tests.support.chaos import PARTITION_KINDS, Applied, Exit, Fault

#: Seconds after a fault during which missing slots are excused (see the module docstring; the
#: lab's kinds: :mod:`tests.support.chaos_lab`). ``kind@target`` applies to that target only, and is
#: looked up before ``kind``.
BLACKOUT_AFTER_S = {
    "beat_kill": 40.0,
    "beat_stop": 8.0,
    "redis_restart_data": 40.0,
    "redis_restart_empty": 10.0,
    "db_outage": 10.0,
    "db_outage_long": 10.0,
    "partition@beat": 30.0,
    "partition_one_way@beat": 30.0,
    "sentinel_failover": 10.0,
    "pgbouncer_restart": 10.0,
}
#: Seconds after a fault during which an execution may sit with no step body running (recovery
#: needs the heartbeat TTL and a recovery pass; with beat down or waiting for its lock it does
#: not run at all).
STALL_AFTER_S = {
    "worker_kill": 10.0,
    "worker_stop": 10.0,
    "beat_kill": 40.0,
    "beat_stop": 8.0,
    "redis_restart_data": 40.0,
    "redis_restart_empty": 15.0,
    "db_outage": 10.0,
    "db_outage_long": 10.0,
    "partition": 10.0,
    "partition_one_way": 10.0,
    "partition@beat": 30.0,
    "partition_one_way@beat": 30.0,
    "sentinel_failover": 15.0,
    "pgbouncer_restart": 10.0,
}


def window_s(table: dict[str, float], fault: Fault) -> float | None:
    """The fault's window in ``table`` (its ``kind@target`` entry, else its kind's), or None."""
    return table.get(f"{fault.kind}@{fault.target}", table.get(fault.kind))


#: Seconds an in-progress execution may sit with no step body running, outside those windows.
STALL_S = 15.0
#: Slack for timestamps taken before a commit (see "Nothing after final").
WRITE_SLACK_S = 2.0
#: Times two processes wrote may disagree by this much: each reads the reference clock (Redis's
#: ``TIME``) off by up to half its reading's round trip, which is at most ``MAX_ROUND_TRIP_S``. A
#: group's first step may so seem to open before the previous group's last step closed.
CLOCK_SLACK_S = MAX_ROUND_TRIP_S
#: A nominal time within this of a grid point is that slot (run keys keep milliseconds).
SLOT_TOLERANCE_S = 0.05
SUCCEEDED = {ActivityStatus.COMPLETE, ActivityStatus.COMPLETE_WITH_WARNING}
FINISHED_OK = SUCCEEDED | {ActivityStatus.COMPLETE_WITH_ERROR}
REGULAR = {Trigger.CRON, Trigger.INTERVAL}


@dataclass(frozen=True)
class Violation:
    invariant: str
    detail: str
    #: When it happened (epoch seconds) and to which schedule, where one time says it: the report
    #: prints the processes' log lines around it.
    at: float | None = None
    schedule: str | None = None

    def __str__(self) -> str:
        return f"[{self.invariant}] {self.detail}"


@dataclass
class Snapshot:
    schedules: list[Schedule]
    executions: list[ScheduleExecution]
    activities: list[Activity]
    tasks: list[WorkerTask]
    slots: list[SlotRecord]


def snapshot(url: str) -> Snapshot:
    with transaction(url, read_only=True) as session:
        return Snapshot(
            list(session.scalars(select(Schedule).order_by(Schedule.id))),
            list(session.scalars(select(ScheduleExecution).order_by(ScheduleExecution.id))),
            list(session.scalars(select(Activity).order_by(Activity.id))),
            list(session.scalars(select(WorkerTask).order_by(WorkerTask.id))),
            list(session.scalars(select(SlotRecord).order_by(SlotRecord.id))),
        )


@dataclass
class BodyRun:
    """One run of a step body, from the step log."""

    execution_id: int
    step: str
    attempt: int
    pid: int
    ppid: int
    start: float
    end: float | None = None
    outcome: str | None = None


def read_step_log(path: Path) -> list[BodyRun]:
    runs: list[BodyRun] = []
    open_runs: dict[tuple[int, str, int, int], list[BodyRun]] = defaultdict(list)
    if not path.exists():
        return runs
    for line in path.read_text().splitlines():
        event = json.loads(line)
        key = (event["execution_id"], event["step"], event["attempt"], event["pid"])
        if event["event"] == "start":
            run = BodyRun(*key, ppid=event["ppid"], start=event["t"])
            runs.append(run)
            open_runs[key].append(run)
        elif open_runs[key]:
            run = open_runs[key].pop(0)
            run.end, run.outcome = event["t"], event.get("outcome")
    return runs


def ts(value: datetime | None) -> float:
    assert value is not None
    return value.astimezone(UTC).timestamp()


@dataclass
class Context:
    snapshot: Snapshot
    runs: list[BodyRun]
    applied: list[Applied]
    deaths: dict[int, float]
    exits: list[Exit]
    #: Epoch seconds: the load started, schedules were paused, everything settled (or gave up).
    started: float
    firing_end: float
    settled: float
    execution_bound_s: float
    #: Pool process pid -> when one with that pid was seen gone while its worker lived on.
    pool_deaths: dict[int, list[float]] = field(default_factory=dict)
    activity_of: dict[tuple[int, str, int], Activity] = field(default_factory=dict)
    execution_of: dict[int, ScheduleExecution] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.activity_of = {(a.execution_id, a.step_name, a.attempt): a for a in self.snapshot.activities}
        self.execution_of = {e.id: e for e in self.snapshot.executions}

    def rel(self, t: float) -> str:
        return f"+{t - self.started:.1f}s"

    def near(self, t: float) -> str:
        """The faults going on at ``t``, and the last one that ended in the 15 s before it."""
        during = [a for a in self.applied if a.started - 1 <= t <= (a.ended or t) + 1]
        before = [a for a in self.applied if a.ended < t - 1 and a not in during]
        parts = [f"during {self._fault(a)}" for a in during]
        if before and (not during or t - before[-1].ended <= 15):
            parts.append(f"{t - before[-1].ended:.1f}s after {self._fault(before[-1])}")
        return "; ".join(parts) or "before any fault"

    def _fault(self, applied: Applied) -> str:
        fault = applied.fault
        return f"{fault.kind} {fault.target} {self.rel(applied.started)}..{self.rel(applied.ended)}"

    def body_end(self, run: BodyRun) -> tuple[float, str]:
        if run.end is not None:
            return run.end, "logged"
        died = [(self.deaths[run.ppid], "worker died")] if run.ppid in self.deaths else []
        # A death before the start was another pool process's that had the pid: it ended nothing.
        died += [(at, "pool process died") for at in self.pool_deaths.get(run.pid, []) if at >= run.start]
        if died:
            return min(died)
        activity = self.activity_of.get((run.execution_id, run.step, run.attempt))
        if activity is not None and activity.completed_at is not None and not _worker_lost(activity):
            return ts(activity.completed_at), "activity closed"
        return self.settled, "never ended"


#: How long a fenced body may go on after its frozen worker wakes (the watch's next look, and the
#: interrupt landing in the body's thread).
WAKE_TOLERANCE_S = 0.5


def running_within(ctx: Context, run: BodyRun, lo: float, hi: float) -> float:
    """Seconds of [lo, hi] during which ``run``'s worker was not stopped (so the body could run)."""
    if hi <= lo:
        return 0.0
    frozen = [(a.started, a.ended or hi) for a in ctx.applied if a.fault.kind == "worker_stop" and a.pid == run.ppid]
    return (hi - lo) - _covered(lo, hi, _merged(frozen))


def _worker_lost(activity: Activity) -> bool:
    return (activity.error or "").startswith("worker lost")


def _describe(activity: Activity | None) -> str:
    if activity is None:
        return "no activity row"
    return f"activity {activity.status.value}" + (f" ({activity.error[:80]})" if activity.error else "")


# --- executions end -----------------------------------------------------------------------------


def check_final(ctx: Context) -> list[Violation]:
    out = []
    for e in ctx.snapshot.executions:
        if e.status is ExecutionStatus.IN_PROGRESS:
            tasks = [
                f"{t.step_name}:{t.status.value}/a{t.attempt}" for t in ctx.snapshot.tasks if t.execution_id == e.id
            ]
            out.append(
                Violation(
                    "every execution ends",
                    f"execution {e.id} ({e.schedule_name}, {e.trigger.value}, started {ctx.rel(ts(e.started_at))}) "
                    f"still in_progress {ctx.settled - ctx.firing_end:.0f}s after schedules were paused; "
                    f"group {e.current_step_index}, tasks {tasks}; {ctx.near(ts(e.started_at))}",
                )
            )
        elif e.completed_at is not None and ts(e.completed_at) - ts(e.started_at) > ctx.execution_bound_s:
            took = ts(e.completed_at) - ts(e.started_at)
            out.append(
                Violation(
                    "every execution ends",
                    f"execution {e.id} ({e.schedule_name}) took {took:.0f}s (bound {ctx.execution_bound_s:.0f}s), "
                    f"{e.status.value}: {e.error}; {ctx.near(ts(e.started_at))}",
                )
            )
    return out


def check_leftovers(ctx: Context) -> list[Violation]:
    out = []
    for a in ctx.snapshot.activities:
        if a.status is ActivityStatus.IN_PROGRESS:
            status = ctx.execution_of[a.execution_id].status.value
            out.append(
                Violation(
                    "nothing left in progress",
                    f"activity {a.step_name} attempt {a.attempt} of execution {a.execution_id} ({status}) still "
                    f"in_progress, started {ctx.rel(ts(a.started_at))} on {a.worker}; "
                    f"{ctx.near(ts(a.started_at))}",
                )
            )
    for t in ctx.snapshot.tasks:
        status = ctx.execution_of[t.execution_id].status.value
        out.append(
            Violation(
                "nothing left in progress",
                f"worker task {t.step_name} attempt {t.attempt} of execution {t.execution_id} ({status}) left "
                f"{t.status.value} (node {t.node})",
            )
        )
    return out


# --- step bodies ----------------------------------------------------------------------------------


def check_no_concurrent_bodies(ctx: Context) -> list[Violation]:
    out = []
    by_step: dict[tuple[int, str], list[BodyRun]] = defaultdict(list)
    for run in ctx.runs:
        by_step[(run.execution_id, run.step)].append(run)
    for (execution_id, step), runs in by_step.items():
        runs.sort(key=lambda r: r.start)
        for i, first in enumerate(runs):
            end, why = ctx.body_end(first)
            for second in runs[i + 1 :]:
                if second.start >= end:
                    break
                if running_within(ctx, first, second.start, end) <= WAKE_TOLERANCE_S:
                    continue  # frozen meanwhile, and stopped at once when it woke
                a1 = ctx.activity_of.get((execution_id, step, first.attempt))
                a2 = ctx.activity_of.get((execution_id, step, second.attempt))
                out.append(
                    Violation(
                        "no step body runs twice at once",
                        f"execution {execution_id} step {step!r}: attempt {first.attempt} (pid {first.pid}, "
                        f"{ctx.rel(first.start)}..{ctx.rel(end)} [{why}], {_describe(a1)}) overlaps attempt "
                        f"{second.attempt} (pid {second.pid}, from {ctx.rel(second.start)}, {_describe(a2)}) "
                        f"by {end - second.start:.1f}s; {ctx.near(second.start)}",
                    )
                )
    return out


def check_attempts(ctx: Context) -> list[Violation]:
    out = []
    starts = Counter((r.execution_id, r.step, r.attempt) for r in ctx.runs)
    for (execution_id, step, attempt), count in starts.items():
        first = min(r.start for r in ctx.runs if (r.execution_id, r.step, r.attempt) == (execution_id, step, attempt))
        if (execution_id, step, attempt) not in ctx.activity_of:
            out.append(
                Violation(
                    "every body run is a recorded attempt",
                    f"execution {execution_id} step {step!r} attempt {attempt} ran (from {ctx.rel(first)}) "
                    f"without an activity row; {ctx.near(first)}",
                )
            )
        if count > 1:
            out.append(
                Violation(
                    "every body run is a recorded attempt",
                    f"execution {execution_id} step {step!r} attempt {attempt} ran its body {count} times "
                    f"(a redelivered message re-ran it), first at {ctx.rel(first)}; {ctx.near(first)}",
                )
            )
    attempts: dict[tuple[int, str], list[Activity]] = defaultdict(list)
    for a in ctx.snapshot.activities:
        attempts[(a.execution_id, a.step_name)].append(a)
    for (execution_id, step), rows in attempts.items():
        rows.sort(key=lambda a: a.attempt)
        done = [a for a in rows if a.status in FINISHED_OK]
        if done and done[0] is not rows[-1]:
            later = [f"{a.attempt}:{a.status.value}" for a in rows if a.attempt > done[0].attempt]
            out.append(
                Violation(
                    "a finished step runs again only as a new attempt",
                    f"execution {execution_id} step {step!r} finished in attempt {done[0].attempt} "
                    f"({done[0].status.value}) yet ran again: {later}; {ctx.near(ts(done[0].started_at))}",
                )
            )
    return out


#: A completed body's outcome may be lost with its worker if that worker was killed, frozen or cut
#: off this long after the body ended (the outcome is written right after; a frozen or cut-off
#: worker's attempt is fenced once its heartbeat expires: it cannot tell anyone the step is done).
OUTCOME_WINDOW_S = 60.0


def check_completed_bodies_recorded(ctx: Context) -> list[Violation]:
    """A body that completed is recorded so, unless its worker died, froze or was cut off before it
    could say so: never failed as lost (and run again) because the database or Redis was away."""
    out = []
    for run in ctx.runs:
        if run.outcome != "ok" or run.end is None:
            continue
        row = ctx.activity_of.get((run.execution_id, run.step, run.attempt))
        if row is None or not (_worker_lost(row) or (row.error or "").startswith("outcome could not be recorded")):
            continue
        end = run.end
        died = ctx.deaths.get(run.ppid)
        # Frozen or cut off while the body ran (its end logged as it woke, after recovery fenced it)
        # or before its outcome was written.
        froze = any(
            a.fault.kind in ("worker_stop", *PARTITION_KINDS)
            and a.pid == run.ppid
            and a.started <= end + OUTCOME_WINDOW_S
            and (a.ended or ctx.settled) >= run.start
            for a in ctx.applied
        )
        if (died is not None and died <= end + OUTCOME_WINDOW_S) or froze:
            continue
        out.append(
            Violation(
                "a completed step is recorded completed",
                f"execution {run.execution_id} step {run.step!r} attempt {run.attempt} completed at {ctx.rel(end)} "
                f"on a live worker, yet was recorded {_describe(row)}; {ctx.near(end)}",
            )
        )
    return out


# --- slots ----------------------------------------------------------------------------------------


def nominal_of(execution: ScheduleExecution) -> datetime | None:
    """The slot a regular run stands for, from its run key ``<name>:<cron|interval>:<iso>``."""
    kind, _, at = execution.run_key[len(execution.schedule_name) + 1 :].partition(":")
    if execution.trigger not in REGULAR or kind not in ("cron", "interval"):
        return None
    return datetime.fromisoformat(at.replace("Z", "+00:00"))


def grid(schedule: Schedule) -> tuple[float, float]:
    """(anchor, period) in epoch seconds; the suite's cron schedules are minutely."""
    if schedule.cron is not None:
        assert schedule.cron == "* * * * *", "the chaos suite only checks minutely cron schedules"
        return 0.0, 60.0
    assert schedule.every_s is not None
    return ts(schedule.updated_at), schedule.every_s


def _after_death(ctx: Context, schedule: Schedule) -> list[tuple[float, float]]:
    """From the end of the failed run that left ``schedule`` dead: nothing of it fires after."""
    if schedule.status is not ScheduleStatus.DEAD:
        return []
    failures = [
        ts(e.completed_at)
        for e in ctx.snapshot.executions
        if e.schedule_name == schedule.name and e.status is ExecutionStatus.FAILED and e.completed_at is not None
    ]
    return [(max(failures) - 0.5, ctx.firing_end + 0.5)] if failures else []


def _blackouts(ctx: Context) -> list[tuple[float, float]]:
    return [
        (a.started - 0.5, a.ended + after)
        for a in ctx.applied
        if (after := window_s(BLACKOUT_AFTER_S, a.fault)) is not None
    ]


def _decided_slots(ctx: Context, schedule: Schedule, out: list[Violation]) -> tuple[dict[int, list[str]], int]:
    """Slot index -> what decided it (executions, slot records); and how many were recorded late."""
    anchor, period = grid(schedule)
    decided: list[tuple[datetime, str, float]] = [
        (nominal, f"execution {e.id}", ts(e.started_at))
        for e in ctx.snapshot.executions
        if e.schedule_name == schedule.name and (nominal := nominal_of(e)) is not None
    ]
    decided += [
        (r.nominal_at, r.outcome.value + (f"#{r.execution_id}" if r.execution_id else ""), ts(r.recorded_at))
        for r in ctx.snapshot.slots
        if r.schedule_name == schedule.name and r.trigger in REGULAR and r.nominal_at is not None
    ]
    seen: dict[int, list[str]] = defaultdict(list)
    late = 0
    for nominal, what, recorded in decided:
        k_float = (ts(nominal) - anchor) / period
        k = round(k_float)
        if abs(k_float - k) * period > SLOT_TOLERANCE_S:
            out.append(
                Violation(
                    "no slot fires twice",
                    f"{schedule.name}: {what} at {nominal.isoformat()} is not one of the schedule's slots",
                )
            )
        seen[k].append(what)
        late += recorded - ts(nominal) > period + 1
    for k, whats in sorted(seen.items()):
        executions = [w for w in whats if w.startswith("execution")]
        records = [w for w in whats if not w.startswith("execution")]
        if any(w.startswith(SlotOutcome.FIRED.value) for w in records):
            # A buffered slot's run, started when the active one ended, is recorded fired for the
            # slot too: one slot waiting, then firing once, is one decision.
            records = [w for w in records if w != SlotOutcome.BUFFERED.value]
        if len(executions) > 1 or len(records) > 1:
            t = anchor + k * period
            out.append(
                Violation(
                    "no slot fires twice",
                    f"{schedule.name}: slot {ctx.rel(t)} decided twice: {whats}; {ctx.near(t)}",
                )
            )
    return seen, late


def check_slots(ctx: Context) -> tuple[list[Violation], dict[str, Any]]:
    out: list[Violation] = []
    stats: dict[str, Any] = {"slots_checked": 0, "slots_missing_excused": 0, "late_records": 0}
    blackouts = _blackouts(ctx)
    for schedule in ctx.snapshot.schedules:
        anchor, period = grid(schedule)
        seen, late = _decided_slots(ctx, schedule, out)
        stats["late_records"] += late
        if not seen:
            continue
        excused = blackouts + _after_death(ctx, schedule)
        last = int((ctx.firing_end - 1.5 - anchor) // period)
        for k in range(min(seen), last + 1):
            stats["slots_checked"] += 1
            t = anchor + k * period
            if k in seen:
                continue
            if any(lo <= t <= hi for lo, hi in excused):
                stats["slots_missing_excused"] += 1
                continue
            out.append(
                Violation(
                    "no due slot vanishes",
                    f"{schedule.name}: slot {datetime.fromtimestamp(t, UTC).isoformat(timespec='milliseconds')} "
                    f"({ctx.rel(t)}) has neither an execution nor a slot record; {ctx.near(t)}",
                    at=t,
                    schedule=schedule.name,
                )
            )
    return out, stats


# --- fencing and final states ------------------------------------------------------------------------


def check_nothing_after_final(ctx: Context) -> list[Violation]:
    out = []
    for a in ctx.snapshot.activities:
        e = ctx.execution_of[a.execution_id]
        if e.completed_at is None:
            continue
        end = ts(e.completed_at)
        # Written by two processes (the claim, the run's end), each on its reading of the
        # reference clock: an opening up to the readings' disagreement later is not after.
        if ts(a.started_at) > end + CLOCK_SLACK_S:
            out.append(
                Violation(
                    "nothing changes after final",
                    f"activity {a.step_name} attempt {a.attempt} of execution {e.id} ({e.status.value} at "
                    f"{ctx.rel(end)}) opened {ts(a.started_at) - end:.2f}s later; {ctx.near(end)}",
                )
            )
        if a.completed_at is not None and ts(a.completed_at) > end + WRITE_SLACK_S:
            out.append(
                Violation(
                    "nothing changes after final",
                    f"activity {a.step_name} attempt {a.attempt} of execution {e.id} ({e.status.value} at "
                    f"{ctx.rel(end)}) closed {ts(a.completed_at) - end:.1f}s later as {a.status.value}; "
                    f"{ctx.near(end)}",
                )
            )
        if _worker_lost(a) and a.status is not ActivityStatus.FAILED_WITH_ERROR:
            out.append(
                Violation(
                    "fenced attempts change nothing",
                    f"activity {a.step_name} attempt {a.attempt} of execution {e.id} says {a.error!r} "
                    f"but is {a.status.value}",
                )
            )
    for run in ctx.runs:
        owner = ctx.execution_of.get(run.execution_id)
        if owner is not None and owner.completed_at is not None and run.start > ts(owner.completed_at) + WRITE_SLACK_S:
            out.append(
                Violation(
                    "nothing changes after final",
                    f"step {run.step!r} attempt {run.attempt} of execution {owner.id} started its body "
                    f"{run.start - ts(owner.completed_at):.1f}s after the execution ended ({owner.status.value}); "
                    f"{ctx.near(run.start)}",
                )
            )
    return out


def check_outcomes(ctx: Context) -> list[Violation]:
    """Groups ran in order, and a completed execution's steps all finished acceptably."""
    out = []
    rows: dict[int, list[Activity]] = defaultdict(list)
    for a in ctx.snapshot.activities:
        rows[a.execution_id].append(a)
    for e in ctx.snapshot.executions:
        latest: dict[str, Activity] = {}
        for a in sorted(rows[e.id], key=lambda a: a.attempt):
            latest[a.step_name] = a
        for index in range(1, len(e.plan)):
            previous = [latest[s["name"]] for s in e.plan[index - 1] if s["name"] in latest]
            current = [a for a in rows[e.id] if a.step_index == index]
            if not current or not previous:
                continue
            closed = [ts(a.completed_at) for a in previous if a.completed_at is not None]
            opened = min(ts(a.started_at) for a in current)
            if len(closed) < len(e.plan[index - 1]) or opened < max(closed) - CLOCK_SLACK_S:
                out.append(
                    Violation(
                        "groups run in order",
                        f"execution {e.id} ({e.schedule_name}): group {index} started at {ctx.rel(opened)} before "
                        f"group {index - 1} finished ({[(a.step_name, a.attempt, a.status.value) for a in previous]}); "
                        f"{ctx.near(opened)}",
                    )
                )
        if e.status is not ExecutionStatus.COMPLETED:
            continue
        for group in e.plan:
            for spec in group:
                last = latest.get(spec["name"])
                if last is None or not (
                    last.status in SUCCEEDED or (spec.get("continue_on_failure") and last.status.failed)
                ):
                    out.append(
                        Violation(
                            "final state matches the activities",
                            f"execution {e.id} ({e.schedule_name}) completed but step {spec['name']!r} ended "
                            f"{_describe(last)}; {ctx.near(ts(e.started_at))}",
                        )
                    )
    return out


def check_bodies_in_group_order(ctx: Context) -> list[Violation]:
    """No body of a group still runs when the next group's first body starts (fenced attempts too)."""
    out = []
    by_execution: dict[int, list[BodyRun]] = defaultdict(list)
    for run in ctx.runs:
        by_execution[run.execution_id].append(run)
    for execution_id, runs in by_execution.items():
        e = ctx.execution_of.get(execution_id)
        if e is None:
            continue
        index_of = {spec["name"]: i for i, group in enumerate(e.plan) for spec in group}
        for index in range(1, len(e.plan)):
            current = [r for r in runs if index_of.get(r.step) == index]
            if not current:
                continue
            opened = min(r.start for r in current)
            for run in (r for r in runs if index_of.get(r.step) == index - 1):
                end, why = ctx.body_end(run)
                if end > opened + 0.001 and running_within(ctx, run, opened, end) > WAKE_TOLERANCE_S:
                    out.append(
                        Violation(
                            "groups run in order",
                            f"execution {e.id} ({e.schedule_name}): step {run.step!r} attempt {run.attempt} "
                            f"(pid {run.pid}) of group {index - 1} ran until {ctx.rel(end)} [{why}], after group "
                            f"{index} started at {ctx.rel(opened)}; "
                            f"{_describe(ctx.activity_of.get((e.id, run.step, run.attempt)))}; {ctx.near(opened)}",
                        )
                    )
    return out


def _merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for lo, hi in sorted(intervals):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def _covered(lo: float, hi: float, windows: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(hi, w_hi) - max(lo, w_lo)) for w_lo, w_hi in windows)


def check_no_stalls(ctx: Context) -> list[Violation]:
    """An execution never sits with no step body running for long, faults' recovery time aside.

    This is what catches a stranded step even when an execution timeout ends the run later.
    """
    out = []
    excused = _merged(
        [
            (a.started - 0.5, a.ended + after)
            for a in ctx.applied
            if (after := window_s(STALL_AFTER_S, a.fault)) is not None
        ]
    )
    bodies: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for run in ctx.runs:
        bodies[run.execution_id].append((run.start, ctx.body_end(run)[0]))
    for e in ctx.snapshot.executions:
        begin = ts(e.started_at)
        end = ts(e.completed_at) if e.completed_at is not None else ctx.settled
        cursor = begin
        idle = []
        for lo, hi in _merged(bodies[e.id]):
            if lo > cursor:
                idle.append((cursor, lo))
            cursor = max(cursor, hi)
        if end > cursor:
            idle.append((cursor, end))
        for lo, hi in idle:
            uncovered = (hi - lo) - _covered(lo, hi, excused)
            if uncovered > STALL_S:
                out.append(
                    Violation(
                        "no execution stalls",
                        f"execution {e.id} ({e.schedule_name}, {e.status.value}: {e.error or '-'}) ran no step body "
                        f"from {ctx.rel(lo)} to {ctx.rel(hi)} ({uncovered:.0f}s outside fault recovery windows); "
                        f"{ctx.near(lo)}",
                    )
                )
    return out


def check_processes(ctx: Context) -> list[Violation]:
    out = []
    for exit in ctx.exits:
        lines = [line for line in exit.log_tail.splitlines() if line.strip()][-4:]
        out.append(
            Violation(
                "no process crashes",
                f"{exit.name} (pid {exit.pid}) exited with code {exit.code} at {ctx.rel(exit.at)}; "
                f"{ctx.near(exit.at)}; log tail: {' | '.join(lines)}",
            )
        )
    return out


def check_all(ctx: Context) -> tuple[list[Violation], dict[str, Any]]:
    slot_violations, slot_stats = check_slots(ctx)
    violations = [
        *check_final(ctx),
        *check_leftovers(ctx),
        *check_no_concurrent_bodies(ctx),
        *check_attempts(ctx),
        *check_completed_bodies_recorded(ctx),
        *slot_violations,
        *check_nothing_after_final(ctx),
        *check_outcomes(ctx),
        *check_bodies_in_group_order(ctx),
        *check_no_stalls(ctx),
        *check_processes(ctx),
    ]
    return violations, slot_stats


def measurements(ctx: Context) -> dict[str, Any]:
    """What the run did, for the report: counts, and for each fault the time from its end to the
    first step body starting after it."""
    recovery = []
    for a in ctx.applied:
        after = [r.start for r in ctx.runs if r.start >= a.ended]
        first = round(min(after) - a.ended, 2) if after else None
        recovery.append({"fault": a.fault.kind, "at": ctx.rel(a.started), "first_step_s": first})
    fenced_late = 0
    for r in ctx.runs:
        row = ctx.activity_of.get((r.execution_id, r.step, r.attempt))
        if row is not None and _worker_lost(row) and r.end is not None and row.completed_at is not None:
            fenced_late += r.end > ts(row.completed_at)
    return {
        "executions": len(ctx.snapshot.executions),
        "executions_by_status": dict(Counter(e.status.value for e in ctx.snapshot.executions)),
        "executions_timed_out": sum("timed out" in (e.error or "") for e in ctx.snapshot.executions),
        "activities": len(ctx.snapshot.activities),
        "activities_by_status": dict(Counter(a.status.value for a in ctx.snapshot.activities)),
        "slot_records_by_outcome": dict(Counter(s.outcome.value for s in ctx.snapshot.slots)),
        "step_bodies_started": len(ctx.runs),
        "fenced_bodies_that_finished_late": fenced_late,
        "unexpected_exits": len(ctx.exits),
        "pool_processes_died": sum(len(times) for times in ctx.pool_deaths.values()),
        "fault_end_to_first_step_s": recovery,
    }
