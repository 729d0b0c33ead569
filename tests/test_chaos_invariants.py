"""The chaos suite's checks, on hand-made records: what they must flag, and what they must let be."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from celeryapp.config import Settings
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
)
from tests.support import processes
from tests.support.chaos import Applied, Cluster, Database, Fault, pool_processes
from tests.support.chaos_invariants import (
    Context,
    Snapshot,
    Violation,
    _decided_slots,
    check_no_concurrent_bodies,
    check_slots,
    read_step_log,
)
from tests.support.chaos_run import log_excerpt, unended_bodies
from tests.support.servers import wait_for

SLOT = datetime(2026, 11, 25, 1, 0, tzinfo=UTC)


def _slot_check(*outcomes: tuple[SlotOutcome, int | None]) -> list[Violation]:
    schedule = Schedule(name="chaos-buffer", cron="* * * * *")
    records = [
        SlotRecord(
            schedule_name=schedule.name,
            nominal_at=SLOT,
            trigger=Trigger.CRON,
            outcome=outcome,
            execution_id=execution_id,
            recorded_at=SLOT + timedelta(seconds=index),
        )
        for index, (outcome, execution_id) in enumerate(outcomes)
    ]
    start = SLOT.timestamp() - 60
    snap = Snapshot(schedules=[schedule], executions=[], activities=[], tasks=[], slots=records)
    ends = {"firing_end": start + 120, "settled": start + 130}
    ctx = Context(snap, [], [], {}, [], started=start, execution_bound_s=60, **ends)
    out: list[Violation] = []
    _decided_slots(ctx, schedule, out)
    return out


def test_a_buffered_slot_that_fired_once_is_one_decision() -> None:
    assert _slot_check((SlotOutcome.BUFFERED, None), (SlotOutcome.FIRED, 7)) == []


def test_a_slot_fired_twice_or_decided_twice_is_flagged() -> None:
    for twice in (
        ((SlotOutcome.BUFFERED, None), (SlotOutcome.FIRED, 7), (SlotOutcome.FIRED, 8)),
        ((SlotOutcome.FIRED, 7), (SlotOutcome.SKIPPED_OVERLAP, None)),
        ((SlotOutcome.BUFFERED, None), (SlotOutcome.MISSED, None)),
    ):
        (violation,) = _slot_check(*twice)
        assert violation.invariant == "no slot fires twice" and "decided twice" in violation.detail


def _vanished(status: ScheduleStatus) -> list[str]:
    """Slots 0 and 1 of a 4 s schedule ran; the run of slot 1 failed at 5.5 s, and its retry
    started at 9 s (or, when ``status`` is dead, failed at 7.5 s); slot 2 (8 s) has no record."""
    every = timedelta(seconds=4)
    schedule = Schedule(name="chaos-pipeline", every_s=4, max_retries=2, updated_at=SLOT, status=status)

    def run(index: int, trigger: Trigger, key: str, started: float, ended: float, ok: bool) -> ScheduleExecution:
        return ScheduleExecution(
            id=index,
            schedule_name=schedule.name,
            run_key=key,
            trigger=trigger,
            status=ExecutionStatus.COMPLETED if ok else ExecutionStatus.FAILED,
            started_at=SLOT + timedelta(seconds=started),
            completed_at=SLOT + timedelta(seconds=ended),
        )

    runs = [
        run(1, Trigger.INTERVAL, f"chaos-pipeline:interval:{SLOT.isoformat()}", 0, 1, True),
        run(2, Trigger.INTERVAL, f"chaos-pipeline:interval:{(SLOT + every).isoformat()}", 4, 5.5, False),
        # Dead: the retry started at 6 s and failed at 7.5 s, its last, before slot 2 was due.
        run(3, Trigger.RETRY, "chaos-pipeline:retry:x", 9, 10, True)
        if status is not ScheduleStatus.DEAD
        else run(3, Trigger.RETRY, "chaos-pipeline:retry:x", 6, 7.5, False),
    ]
    snap = Snapshot(schedules=[schedule], executions=runs, activities=[], tasks=[], slots=[])
    start = SLOT.timestamp()
    ctx = Context(snap, [], [], {}, [], started=start, firing_end=start + 11, settled=start + 12, execution_bound_s=60)
    violations, _ = check_slots(ctx)
    return [v.detail for v in violations]


def test_a_slot_due_while_a_retry_was_pending_needs_a_record_unless_the_schedule_died() -> None:
    """Its fire, or the retry's, records it ``retry`` (CI, SQLite, seed 165042: neither did)."""
    (detail,) = _vanished(ScheduleStatus.PAUSED)
    assert "slot" in detail and "(+8.0s) has neither an execution nor a slot record" in detail
    assert _vanished(ScheduleStatus.DEAD) == []


# --- a body frozen by a SIGSTOP just after it started (CI, PostgreSQL, seed 846922) ---------------

STOPPED_AT = SLOT.timestamp()
WAKE = STOPPED_AT + 3.4
FROZEN_WORKER, OTHER_WORKER = 100, 200


def _line(event: str, attempt: int, ppid: int, t: float, **extra: object) -> str:
    fields = {"event": event, "execution_id": 1, "step": "a", "attempt": attempt, "pid": ppid + 1, "ppid": ppid}
    return json.dumps({**fields, "t": t, **extra})


def _frozen_start_check(
    tmp_path: Path, attempt_1_end: float | None, pool_deaths: dict[int, list[float]] | None = None
) -> list[Violation]:
    """Attempt 1 starts 0.1 s before its worker's 3.4 s SIGSTOP; recovery closes it as lost and
    attempt 2 starts on the other worker during the stop. ``attempt_1_end``: its end line's time;
    ``pool_deaths``: the pool processes the supervisor saw die, and when."""
    lines = [_line("start", 1, FROZEN_WORKER, STOPPED_AT - 0.1)]
    lines.append(_line("start", 2, OTHER_WORKER, STOPPED_AT + 3.2))
    if attempt_1_end is not None:
        lines.append(_line("end", 1, FROZEN_WORKER, attempt_1_end, outcome="StepCancelled"))
    lines.append(_line("end", 2, OTHER_WORKER, STOPPED_AT + 3.5, outcome="ok"))
    log = tmp_path / "steps.log"
    log.write_text("\n".join(lines) + "\n")
    at = datetime.fromtimestamp
    activities = [
        Activity(
            execution_id=1,
            step_index=0,
            step_name="a",
            attempt=1,
            status=ActivityStatus.FAILED_WITH_ERROR,
            started_at=at(STOPPED_AT - 0.2, UTC),
            completed_at=at(STOPPED_AT + 3.1, UTC),
            error="worker lost: no heartbeat from w1",
        ),
        Activity(
            execution_id=1,
            step_index=0,
            step_name="a",
            attempt=2,
            status=ActivityStatus.COMPLETE,
            started_at=at(STOPPED_AT + 3.15, UTC),
            completed_at=at(STOPPED_AT + 3.6, UTC),
        ),
    ]
    stop = Applied(Fault(10.0, "worker_stop", "w1", 3.4), started=STOPPED_AT, ended=WAKE, pid=FROZEN_WORKER)
    snap = Snapshot(schedules=[], executions=[], activities=activities, tasks=[], slots=[])
    ends = {"firing_end": STOPPED_AT + 20, "settled": STOPPED_AT + 30}
    ctx = Context(
        snap,
        read_step_log(log),
        [stop],
        {},
        [],
        started=STOPPED_AT - 10,
        execution_bound_s=60,
        pool_deaths=pool_deaths or {},
        **ends,
    )
    return check_no_concurrent_bodies(ctx)


def test_a_body_frozen_as_it_started_and_stopped_on_waking_does_not_overlap_its_replacement(tmp_path: Path) -> None:
    # Its end logged as the interrupt landed after the wake: the frozen time does not count.
    assert _frozen_start_check(tmp_path, WAKE + 0.05) == []


def test_a_body_that_ran_on_after_waking_or_never_logged_its_end_overlaps_its_replacement(tmp_path: Path) -> None:
    (ran_on,) = _frozen_start_check(tmp_path, WAKE + 1.0)
    assert ran_on.invariant == "no step body runs twice at once" and "[logged]" in ran_on.detail
    # A start without an end on a live worker ran, for all the check knows, until the end of the
    # test: what the task's step log looked like when the interrupt landed before its ``try``.
    (unended,) = _frozen_start_check(tmp_path, None)
    assert "[never ended]" in unended.detail and "worker lost" in unended.detail


def test_an_end_line_without_its_start_is_ignored(tmp_path: Path) -> None:
    """An interrupt landing before the start line was written leaves its end alone."""
    log = tmp_path / "steps.log"
    lines = [_line("end", 1, FROZEN_WORKER, 1.0, outcome="StepCancelled")]
    lines += [_line("start", 1, FROZEN_WORKER, 2.0), _line("end", 1, FROZEN_WORKER, 3.0, outcome="ok")]
    log.write_text("\n".join(lines) + "\n")
    (run,) = read_step_log(log)
    assert (run.start, run.end, run.outcome) == (2.0, 3.0, "ok")


# --- a body whose pool process died: no end line, yet its worker lives on (sqlite, seed 620205) ---

FROZEN_BODY = FROZEN_WORKER + 1  # the pool process ``_line`` gives attempt 1's body


def test_a_body_whose_pool_process_died_as_its_worker_woke_does_not_overlap_its_replacement(tmp_path: Path) -> None:
    assert _frozen_start_check(tmp_path, None, {FROZEN_BODY: [WAKE + 0.1]}) == []


def test_a_body_whose_pool_process_died_long_after_the_wake_overlaps_its_replacement(tmp_path: Path) -> None:
    (ran_on,) = _frozen_start_check(tmp_path, None, {FROZEN_BODY: [WAKE + 2.0]})
    assert "[pool process died]" in ran_on.detail and "by 2.2s" in ran_on.detail


def test_a_pool_process_death_before_the_start_is_another_process_with_that_pid(tmp_path: Path) -> None:
    (unended,) = _frozen_start_check(tmp_path, None, {FROZEN_BODY: [STOPPED_AT - 5]})
    assert "[never ended]" in unended.detail
    assert _frozen_start_check(tmp_path, None, {FROZEN_BODY: [STOPPED_AT - 5, WAKE + 0.1]}) == []


def test_the_supervisor_notes_a_pool_process_that_died_while_its_worker_lived_on(tmp_path: Path) -> None:
    """A real main process with two children, as a prefork worker has: one child killed is noted
    (and when), the other not; once the main process is killed, its children's end is not one."""
    fork_two = (
        "import os, signal, time\nfor _ in range(2):\n    if os.fork() == 0:\n        signal.pause()\ntime.sleep(60)\n"
    )
    worker = processes.Process([sys.executable, "-c", fork_two], dict(os.environ), tmp_path / "w1.log")
    cluster = Cluster(settings=Settings(), tmp=tmp_path, redis=None, database=Database("sqlite://"))
    cluster.worker_names = ("w1",)
    cluster._procs["w1"] = worker
    try:
        wait_for(lambda: len(pool_processes({worker.pid})) == 2, 10, what="two pool processes")
        first = min(pool_processes({worker.pid}))
        cluster._watch_pools()
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: first not in pool_processes({worker.pid}), 10, what="the first pool process to die")
        before = time.time()
        cluster._watch_pools()
        assert cluster.pool_deaths.keys() == {first} and cluster.pool_deaths[first][0] >= before
        worker.kill()  # the process group: the second pool process with it
        cluster._watch_pools()
        assert cluster.pool_deaths.keys() == {first}
    finally:
        worker.kill()


def test_a_body_left_without_an_end_is_reported_with_its_stacks_or_its_process_gone(tmp_path: Path) -> None:
    """At the end of a plan, a start without an end says what its pool process is doing (every
    thread's stack, from the handler the chaos task module registers) or that it is gone."""
    standing_still = (
        "import os, time\n"
        "import tests.support.chaos_tasks  # as a worker loads it: it registers the handler\n"
        "if os.fork() == 0:\n"
        "    time.sleep(60)  # a body standing still\n"
        "time.sleep(60)\n"
    )
    env = {**os.environ, "PYTHONPATH": processes.ROOT}
    worker = processes.Process([sys.executable, "-c", standing_still], env, tmp_path / "w1.log")
    cluster = Cluster(settings=Settings(), tmp=tmp_path, redis=None, database=Database("sqlite://"))
    cluster._procs["w1"] = worker
    try:
        wait_for(lambda: pool_processes({worker.pid}), 30, what="the pool process")
        (body,) = pool_processes({worker.pid})
        gone = 2**22 + 1  # above any pid_max: no process has it
        start = {"event": "start", "execution_id": 1, "step": "a", "ppid": worker.pid, "t": 1.0}
        log = tmp_path / "steps.jsonl"
        lines = [json.dumps({**start, "attempt": attempt, "pid": pid}) for attempt, pid in ((1, body), (2, gone))]
        log.write_text("\n".join(lines) + "\n")
        alive, dead = unended_bodies(cluster, log)
        assert f"(pid {body}): no end line; its process is alive" in alive
        assert "Current thread" in alive and "<string>" in alive
        assert f"(pid {gone}): no end line; its process is gone" in dead
        assert pool_processes({worker.pid}) == {body: worker.pid}  # the signal did not end it
    finally:
        worker.kill()


def test_a_vanished_slot_comes_with_the_log_lines_around_it(tmp_path: Path) -> None:
    """CI's temporary directory is gone when its failure is read: the report carries the lines."""
    time.tzset()  # the zone of this environment, as a process started now logs in (not one a test left)
    at = datetime(2026, 11, 28, 18, 9, 42, 469000).timestamp()  # local time, as Celery logs

    def line(seconds: float, text: str) -> str:
        stamp = datetime.fromtimestamp(at + seconds).strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]
        return f"[{stamp}: INFO/MainProcess] {text}"

    (tmp_path / "beat.log").write_text(
        "\n".join(
            [
                line(-30, "beat: firing chaos-pipeline"),  # too early
                line(-0.1, "beat: firing chaos-pipeline, chaos-cron"),
                line(1, "beat: reserved entries"),  # names neither the schedule nor a fire
                "a traceback line without a time",
            ]
        )
    )
    (tmp_path / "w1.log").write_text(line(0.5, "Task chordbeat.fire_batch[abc] received") + "\n")
    (tmp_path / "steps.jsonl").write_text(line(0, "chaos-pipeline") + "\n")  # not a process log
    violation = Violation("no due slot vanishes", "chaos-pipeline: slot ...", at=at, schedule="chaos-pipeline")
    excerpt = log_excerpt(tmp_path, violation)
    assert excerpt[0].startswith("--- logs around [no due slot vanishes] chaos-pipeline")
    assert [text.split("] ", 1)[1] for text in excerpt[1:]] == [
        "beat: firing chaos-pipeline, chaos-cron",
        "Task chordbeat.fire_batch[abc] received",
    ]
    assert excerpt[2].startswith("w1: [")
