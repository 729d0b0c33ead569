"""The worker log read as text, as an operator reads it: a failed step's line says it failed (a
WARNING with its reason), and Celery's own line for its runner no longer says "succeeded"; the
run still advances past the failed step (the chord's callback ran)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from celery import Celery

from celeryapp.config import Settings
from tests.support import processes
from tests.support.helpers import call, finished, step, wait_for


def test_a_failed_steps_lines_in_the_worker_log_say_it_failed(
    settings: Settings, client: Celery, tmp_path: Path
) -> None:
    groups: list[Any] = [
        [
            step("fine", kwargs={"seconds": 0}),
            step("ldap", "chordbeat.examples.fail", kwargs={"message": "LDAP said no"}, continue_on_failure=True),
        ],
        step("after", kwargs={"seconds": 0}),
    ]
    with processes.worker(settings, tmp_path, "w1") as worker:
        call(client, "chordbeat.apply_schedule", definition={"name": "nightly", "every": 3600, "steps": groups})
        run = finished(client, call(client, "chordbeat.trigger_schedule", name="nightly")["execution_id"])
        # The step after the failed one ran: the failed step's group advanced (its callback ran).
        assert run["status"] == "completed", run
        assert [a["step"] for a in run["activities"] if a["status"] == "complete"] == ["fine", "after"], run
        wait_for(lambda: "nightly/after[" in worker.output(), 10, what="the last step's line in the log")
        log = worker.output()
    lines = log.splitlines()
    failed = [line for line in lines if "nightly/ldap[" in line]
    assert failed, log
    assert not [line for line in failed if "succeeded" in line], failed
    assert any("WARNING" in line and "its step FAILED" in line and "LDAP said no" in line for line in failed), failed
    told = [line for line in lines if re.search(r"WARNING.*step 'ldap' of execution \d+ \(group 1, attempt 1\)", line)]
    assert told and "failed (continue_on_failure: the run goes on): StepFailed: LDAP said no" in told[0], log
    assert re.search(r"nightly/fine\[\S+\] succeeded in", log), log
