"""The chaos suite's limit checks (tests/support/chaos_limits.py), and the invariant the limits' plan
showed too strict, on hand-made rows and step logs: what they must flag, and what they must let be."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

from sqlalchemy import insert

from celeryapp.states import ExecutionStatus, WorkerTaskStatus
from models import Activity, ActivityStatus, ScheduleExecution, transaction
from models.limit_tables import LIMIT_HOLDS, LIMITS
from tests.support.chaos import Applied, Fault
from tests.support.chaos_invariants import BodyRun, Context, Snapshot, Violation, check_nothing_after_final
from tests.support.chaos_limits import LimitSampler, check_bodies_within_slots, stuck_waiters

IN_PROGRESS = ExecutionStatus.IN_PROGRESS.value
RUNNING = WorkerTaskStatus.PROCESSING.value


def limit(id: int = 1, slots: int = 2, per_key: int | None = None, in_use: int = 0) -> SimpleNamespace:
    return SimpleNamespace(id=id, name=f"l{id}", slots=slots, per_key_slots=per_key, in_use=in_use)


def hold(task: int, limit_id: int = 1, key: str = "", slots: int = 1, **owner: Any) -> SimpleNamespace:
    row = {
        "worker_task_id": task,
        "attempt": 1,
        "limit_id": limit_id,
        "execution_id": 10 + task,
        "step_name": f"s{task}",
        "key": key,
        "slots": slots,
        "task_id": task,
        "task_attempt": 1,
        "task_status": RUNNING,
        "node": "w1@host",
        "execution_status": IN_PROGRESS,
    }
    return SimpleNamespace(**{**row, **owner})


def waiter(task: int, turn: int, limit_id: int = 1, queue: str = "q", **owner: Any) -> SimpleNamespace:
    row = hold(task, limit_id, **{"task_status": WorkerTaskStatus.WAITING_FOR_LIMIT.value, **owner})
    row.queue, row.turn, row.id = queue, turn, task
    return row


def judged(limits: list[Any], holds: list[Any], waiters: list[Any] = []) -> list[str]:  # noqa: B006
    sampler = LimitSampler("sqlite://")
    sampler.judge(100.0, limits, holds, waiters)
    return [f"[{invariant}] {detail}" for _, invariant, detail in sampler.seen.found]


def test_a_limit_over_its_slots_a_key_over_its_share_and_a_drifting_counter_are_flagged() -> None:
    assert judged([limit(in_use=2)], [hold(1), hold(2)]) == []
    (over,) = judged([limit(in_use=3)], [hold(1), hold(2), hold(3)])
    assert over.startswith("[in use never above slots] l1: 3 in use")
    (key,) = judged([limit(slots=3, per_key=1, in_use=2)], [hold(1, key="acme"), hold(2, key="acme")])
    assert "key 'acme' holds 2 of its 1 slots" in key
    (drift,) = judged([limit(in_use=1)], [hold(1), hold(2)])
    assert "in_use says 1, its holds add up to 2" in drift


def test_a_slot_held_or_awaited_by_an_attempt_that_has_ended_is_flagged() -> None:
    ended = [
        hold(1, task_id=None),
        hold(2, task_attempt=2),
        hold(3, execution_status=ExecutionStatus.COMPLETED.value),
        hold(4, task_status=WorkerTaskStatus.WAITING_FOR_LIMIT.value),
    ]
    found = judged([limit(slots=4, in_use=4)], ended)
    assert [line.split(": ", 2)[-1] for line in found] == [
        "its worker task is gone",
        "its worker task is at attempt 2",
        "its execution is completed",
        "its worker task is waiting_for_limit",
    ]
    (stale,) = judged([limit()], [], [waiter(5, 1, task_status=RUNNING)])
    assert stale.startswith("[no waiter stuck]") and "its worker task is processing" in stale


def test_a_waiter_that_could_be_admitted_is_timed_and_a_waiter_behind_another_is_not() -> None:
    sampler = LimitSampler("sqlite://")
    # Room for one: the queue's head could be admitted, the one behind it could not; then it is.
    for t in (0.0, 1.0, 7.0):
        sampler.judge(t, [limit(in_use=1)], [hold(1)], [waiter(2, turn=1), waiter(3, turn=2)])
    sampler.judge(8.0, [limit(in_use=2)], [hold(1), hold(2)], [waiter(3, turn=2)])
    sampler.close(9.0)
    assert sampler.seen.room_spells == [(0.0, 8.0, "worker task 2 attempt 1")]
    ctx = Context(
        Snapshot([], [], [], [], []), [], [], {}, [], started=0.0, firing_end=9, settled=9, execution_bound_s=60
    )
    (stuck,), longest = stuck_waiters(ctx, sampler.seen.room_spells)
    assert stuck.invariant == "no waiter stuck" and longest == 8.0
    # The same wait inside a worker kill's recovery window is excused.
    ctx.applied = [Applied(Fault(0.0, "worker_kill", "w1", 1.0), started=0.0, ended=1.0)]
    assert stuck_waiters(ctx, sampler.seen.room_spells) == ([], 0.0)


def _bodies(spans: list[tuple[float, float | None, int]], applied: list[Applied] = []) -> list[str]:  # noqa: B006
    """Bodies of step ``s`` (using a limit of 2 slots), each (start, end, worker pid)."""
    started = datetime(2026, 11, 28, tzinfo=UTC)
    runs = [BodyRun(i + 1, "s", 1, 100 + i, ppid, start, end) for i, (start, end, ppid) in enumerate(spans)]
    executions = [
        ScheduleExecution(id=i + 1, schedule_name="x", plan=[[{"name": "s", "uses": ["l1"]}]], started_at=started)
        for i in range(len(spans))
    ]
    ctx = Context(
        Snapshot([], executions, [], [], []), runs, applied, {}, [], started=0, firing_end=99, settled=99,
        execution_bound_s=60,
    )  # fmt: skip
    violations, _ = check_bodies_within_slots(ctx, [{"name": "l1", "slots": 2}])
    return [v.detail for v in violations]


def test_more_bodies_at_once_than_slots_are_flagged_unless_handed_on_or_frozen() -> None:
    assert _bodies([(0, 2, 1), (1, 3, 1), (2, 4, 1)]) == []  # a body ending as the next starts
    (over,) = _bodies([(0, 2, 1), (0.5, 3, 1), (1, 4, 1)])
    assert over.startswith("l1: 3 bodies using it ran at once from +1.0s for 1.0s")
    # The first body's worker was SIGSTOPped from 0.5 s to 5 s, its body stopping 0.3 s after waking.
    frozen = [Applied(Fault(0.5, "worker_stop", "w1", 4.5), started=0.5, ended=5.0, pid=1)]
    assert _bodies([(0, 5.3, 1), (1, 6, 2), (2, 7, 2)], frozen) == []
    assert _bodies([(0, 6, 1), (1, 7, 2), (2, 8, 2)], frozen) != []


def test_the_sampler_reads_a_databases_holds(database_url: str) -> None:
    with transaction(database_url) as session:
        session.execute(insert(LIMITS).values(id=1, name="pool", definition={}, slots=1, in_use=1))
        session.execute(
            insert(LIMIT_HOLDS).values(limit_id=1, worker_task_id=7, attempt=1, execution_id=9, step_name="load")
        )
    sampler = LimitSampler(database_url)
    sampler.sample()
    ((_, invariant, detail),) = sampler.seen.found
    assert invariant == "no slot held by an attempt that has ended"
    assert detail == "pool: a slot held by 'load' attempt 1 of execution 9 (worker task 7): its execution is None"
    assert sampler.seen.max_in_use == {"pool": 1}


def test_an_activity_opened_after_its_run_ended_is_flagged_beyond_the_clocks_disagreement() -> None:
    """Seed 3902 on SQLite: p5's claim (one process) wrote 30 ms after the run's end (another
    process, its reading of the reference clock 0.12 s behind) though it committed before it."""
    ended = datetime(2026, 11, 28, 0, 0, 1, tzinfo=UTC)
    run = ScheduleExecution(
        id=1, schedule_name="x", plan=[[{"name": "s"}]], status=ExecutionStatus.COMPLETED, started_at=ended
    )
    run.completed_at = ended

    def opened_after(seconds: float) -> list[Violation]:
        at = ended + timedelta(seconds=seconds)
        activity = Activity(
            execution_id=1, step_index=0, step_name="s", attempt=1, status=ActivityStatus.COMPLETE,
            started_at=at, completed_at=at,
        )  # fmt: skip
        snap = Snapshot([], [run], [activity], [], [])
        ctx = Context(snap, [], [], {}, [], started=0, firing_end=9, settled=9, execution_bound_s=60)
        return check_nothing_after_final(ctx)

    assert opened_after(0.03) == []
    (late,) = opened_after(0.5)
    assert late.invariant == "nothing changes after final" and "opened 0.50s later" in late.detail
