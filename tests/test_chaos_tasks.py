"""The chaos suite's step task: every start it logs has its end, wherever interrupts land.

The harness takes a start without an end on a live worker for a body that ran until the end of the
test. A CI run (PostgreSQL, seed 846922) flagged attempt 1 of a step as running beside its
replacement: its worker was SIGSTOPped 0.1 s after the start line's timestamp, past the lease; on
waking the watch interrupted the body, which stopped, but the interrupt landed as the start line's
fsync returned, before the body's ``try``, so no end line was written. A step with a timeout has
a second interrupt, Celery's soft time limit, which the end line's own guard did not catch.
"""

from __future__ import annotations

import dis
import json
import os
import sys
import threading
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import pytest
import redis
from celery.exceptions import SoftTimeLimitExceeded

from celeryapp.context import StepContext, running_step
from celeryapp.errors import StepCancelled
from celeryapp.worker.heartbeat import StepWatch
from tests.support import chaos_tasks
from tests.support.servers import RedisServer, wait_for

CONTEXT = StepContext(7, "chaos-tasks", "a", 0, 1, {})


def _lines(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _unended_starts(log: Path) -> list[dict[str, Any]]:
    """Start lines with no end line after them (one attempt, one process: the events alternate)."""
    open_starts: list[dict[str, Any]] = []
    for line in _lines(log):
        if line["event"] == "start":
            open_starts.append(line)
        elif open_starts:
            open_starts.pop()
    return open_starts


def test_a_body_stopped_as_its_start_line_was_synced_logs_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The finding's sequence, with the worker's parts: the body thread stands still just after the
    start line's fsync (where the SIGSTOP froze it) while no heartbeat reaches Redis, until the
    time-keeping thread stops it for its lost lease; the interrupt lands as the body goes on."""
    log = tmp_path / "steps.log"
    held, release = threading.Event(), threading.Event()
    real_fsync = os.fsync
    body_thread: list[int] = []

    def fsync_then_stand_still(fd: int) -> None:
        real_fsync(fd)
        if threading.get_ident() in body_thread and not held.is_set():
            held.set()
            release.wait()

    monkeypatch.setattr(os, "fsync", fsync_then_stand_still)
    server = RedisServer()
    server.start()
    watches: list[StepWatch] = []
    ended: list[str] = []

    def body() -> None:
        body_thread.append(threading.get_ident())
        # Made in this thread: the one it interrupts. A 1 s TTL: the lease runs out 0.75 s after
        # the last refresh Redis acknowledged.
        watch = StepWatch(redis.Redis.from_url(server.url), heartbeat_key="hb", cancel_key="cancel", ttl_s=1.0)
        watches.append(watch)
        try:
            with watch, running_step(CONTEXT):
                chaos_tasks.step(str(log), sleep_min=2.0, sleep_max=2.0)
            ended.append("returned")
        except StepCancelled:
            ended.append("interrupted")

    thread = threading.Thread(target=body, name="chaos-tasks-body")
    try:
        thread.start()
        assert held.wait(10), "the body never logged its start"
        server.close()  # no refresh reaches Redis from now on, as while the worker stood still
        wait_for(lambda: watches[0].lease_lost, 5, what="the time-keeping thread to stop the step")
        release.set()  # the worker wakes
        thread.join(10)
    finally:
        release.set()
        server.close()
    assert ended == ["interrupted"]
    assert [(line["event"], line.get("outcome")) for line in _lines(log)] == [
        ("start", None),
        ("end", "StepCancelled"),
    ]


#: Where CPython 3.11 raises an asynchronous exception (the watch's interrupt): at the instructions
#: that check for one (a call, once the callee returns; a loop's jump back; a function's start),
#: never between two others. Landing places seen with ``PyThreadState_SetAsyncExc``: (PRE)CALL and
#: JUMP_BACKWARD only.
CHECKS_FOR_INTERRUPTS = frozenset({"RESUME", "PRECALL", "CALL", "JUMP_BACKWARD"})


def _checks(code: CodeType) -> frozenset[int]:
    return frozenset(i.offset for i in dis.get_instructions(code) if i.opname in CHECKS_FOR_INTERRUPTS)


def _run_interrupted_at(place: int, log: Path, *, fails: bool, interrupt: type[BaseException] = StepCancelled) -> int:
    """Run the step with ``interrupt`` raised at its ``place``-th instruction that checks for
    interrupts (counted in this module's code: the body and ``record``), as it lands there; how
    many such places it passed. An exception from a trace function unsets it: one interrupt."""
    count = 0
    checks: dict[CodeType, frozenset[int]] = {}

    def each_instruction(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal count
        if event == "opcode" and frame.f_lasti in checks[frame.f_code]:
            count += 1
            if count == place:
                raise interrupt
        return each_instruction

    def each_call(frame: FrameType, event: str, arg: object) -> Any:
        if frame.f_code.co_filename != chaos_tasks.__file__:
            return None
        checks.setdefault(frame.f_code, _checks(frame.f_code))
        frame.f_trace_opcodes = True
        return each_instruction

    previous = sys.gettrace()
    sys.settrace(each_call)
    try:
        with running_step(CONTEXT):
            chaos_tasks.step(str(log), sleep_max=0.0, fail_rate=1.0 if fails else 0.0)
    except (StepCancelled, SoftTimeLimitExceeded, chaos_tasks.ChaosStepFailed):
        pass
    finally:
        sys.settrace(previous)
    return count


def _places_leaving_a_start_unended(tmp_path: Path, **how: Any) -> tuple[list[int], int]:
    total = _run_interrupted_at(0, tmp_path / "uninterrupted.log", **how)
    assert _unended_starts(tmp_path / "uninterrupted.log") == [] and total > 20
    unended = []
    for place in range(1, total + 1):
        log = tmp_path / f"at-{place}.log"
        _run_interrupted_at(place, log, **how)
        if _unended_starts(log):
            unended.append(place)
    return unended, total


@pytest.mark.parametrize("interrupt", [StepCancelled, SoftTimeLimitExceeded])
@pytest.mark.parametrize("fails", [False, True], ids=["ok", "failed"])
def test_wherever_an_interrupt_lands_a_logged_start_has_its_end(
    tmp_path: Path, fails: bool, interrupt: type[BaseException]
) -> None:
    """Every place of the body and its log writes where an interrupt may land, in turn: none leaves
    a start line without an end line. Before the fix: the start line's fsync and close (after its
    write, before the body's ``try``), and for a soft time limit the end line's writing too."""
    unended, total = _places_leaving_a_start_unended(tmp_path, fails=fails, interrupt=interrupt)
    assert unended == [], f"{len(unended)} of {total} landing places leave a start without an end"


def test_a_soft_time_limit_landing_as_an_interrupted_body_logs_its_end_leaves_no_start_unended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step's timeout (and a frozen worker's waking) brings two interrupts: the watch's, landing at
    each place in turn, and Celery's soft time limit, landing just before the end line is written
    (before that, it has the same effect; after, the line is there)."""
    real_write = os.write
    armed = [False]

    def soft_limit_before_the_end_line(fd: int, data: bytes) -> int:
        if armed[0] and b'"event": "end"' in data:
            armed[0] = False
            raise SoftTimeLimitExceeded
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", soft_limit_before_the_end_line)
    total = _run_interrupted_at(0, tmp_path / "uninterrupted.log", fails=False)
    unended = []
    for place in range(1, total + 1):
        armed[0] = True
        log = tmp_path / f"at-{place}.log"
        _run_interrupted_at(place, log, fails=False)
        if _unended_starts(log):
            unended.append(place)
    assert unended == [], f"{len(unended)} of {total} landing places leave a start without an end"
