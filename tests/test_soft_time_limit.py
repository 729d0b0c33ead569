"""A soft time limit that reaches a pool process late (Celery's main process sends it after the task
it was for ended) interrupts neither the process's next step nor the idle process."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from celery import Celery

from celeryapp.config import Settings
from tests.support import processes
from tests.support.fault_tasks import read_log
from tests.support.helpers import call, finished, wait_for

pytestmark = pytest.mark.slow


def until_released(log: Path, flag: Path) -> dict[str, object]:
    """A step without a timeout that ticks until ``flag`` exists."""
    return {
        "name": "long",
        "task": "faults.tick",
        "kwargs": {"log": str(log), "seconds": 25, "until": str(flag)},
    }


@pytest.mark.timeout(120)
def test_a_late_soft_time_limit_is_ignored_by_the_next_step_and_an_idle_process(
    client: Celery, settings: Settings, tmp_path: Path
) -> None:
    """Before: the stray SIGUSR1 raised SoftTimeLimitExceeded in a step without a timeout, whose
    outcome then failed to format ('timed out after Nones'), and killed the idle pool process."""
    log, flag = tmp_path / "steps.log", tmp_path / "release"
    definition = {"name": "stray-limit", "every": 3600, "steps": [until_released(log, flag)]}
    with processes.worker(settings, tmp_path, "w1", concurrency=1, env=processes.FAULT_TASKS_ENV) as worker:
        call(client, "chordbeat.apply_schedule", definition=definition)
        first = call(client, "chordbeat.trigger_schedule", name="stray-limit")["execution_id"]
        ticks = wait_for(lambda: [e for e in read_log(str(log)) if e["event"] == "tick"], 30, what="the step to tick")
        assert isinstance(ticks, list)
        pool_pid = ticks[0]["pid"]
        sent_at = time.time()
        os.kill(pool_pid, signal.SIGUSR1)  # what the main process sends when a soft limit passes
        wait_for(
            lambda: [e for e in read_log(str(log)) if e["event"] == "interrupted" or e["t"] > sent_at + 0.3],
            10,
            what="the step to go on ticking, or be interrupted",
        )
        flag.touch()
        done = finished(client, first, timeout=30)
        assert done["status"] == "completed", done
        assert [(a["attempt"], a["status"]) for a in done["activities"]] == [(1, "complete")]
        assert [e["event"] for e in read_log(str(log)) if e["event"] in ("interrupted", "end")] == ["end"]

        logged = worker.output().count("arrived late")
        os.kill(pool_pid, signal.SIGUSR1)  # now idle, between tasks
        wait_for(
            lambda: worker.output().count("arrived late") > logged,
            10,
            what=f"the idle process to log the stray:\n{worker.output()[-3000:]}",
        )
        second = call(client, "chordbeat.trigger_schedule", name="stray-limit")["execution_id"]
        assert finished(client, second, timeout=30)["status"] == "completed"
    starts = [e for e in read_log(str(log)) if e["event"] == "start"]
    assert [e["pid"] for e in starts] == [pool_pid, pool_pid], "the idle pool process died and was replaced"
