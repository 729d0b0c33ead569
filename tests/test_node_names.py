"""A worker's node name (``celery worker -n``) at startup recovery: a second live worker given the same
name takes nothing from the first; a node restarting before its heartbeats expired still re-queues
its orphans as soon as they expire."""

from __future__ import annotations

from pathlib import Path

import pytest
from celery import Celery

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from tests.support import processes
from tests.support.helpers import call, execution, finished, running, step, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.both_databases]

#: What the second worker logs when its node name is another live worker's.
DUPLICATE = "is also the name of another live worker"


@pytest.mark.timeout(120)
def test_a_second_live_worker_with_the_same_node_name_takes_none_of_the_firsts_running_steps(
    app: ChordbeatCelery, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    long = step("long", kwargs={"seconds": 12})
    with processes.worker(settings, tmp_path, "twin") as first:
        call(client, "chordbeat.apply_schedule", definition={"name": "twins", "every": 3600, "steps": [long]})
        execution_id = call(client, "chordbeat.trigger_schedule", name="twins")["execution_id"]
        node = running(client, execution_id, "long")["worker"]
        argv = processes.worker_argv("twin", 2)
        second = processes.Process(argv, processes.settings_env(settings), tmp_path / "twin-second.log")
        with processes.running(second):
            wait_for(lambda: f"{node} ready." in second.output(), 60, what="the second worker to start")
            assert execution(client, execution_id)["status"] == "in_progress", "the step ended too soon to test"
            done = finished(client, execution_id, timeout=60)
            assert [(a["step"], a["attempt"], a["status"]) for a in done["activities"]] == [("long", 1, "complete")]
            assert done["status"] == "completed"
            assert DUPLICATE in second.output() and node in second.output()
            # Both go on working: a run after it completes (on either of them).
            call(client, "chordbeat.apply_schedule", definition={"name": "short", "every": 3600, "steps": [step("a")]})
            short = call(client, "chordbeat.trigger_schedule", name="short")["execution_id"]
            assert finished(client, short)["status"] == "completed"
        assert first.running


@pytest.mark.timeout(120)
def test_a_node_restarting_before_its_heartbeats_expired_requeues_its_orphans_when_they_expire(
    app: ChordbeatCelery, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    # A TTL far longer than a worker's start: the restarted node finds its orphan's heartbeat alive.
    env = {"CHORDBEAT_HEARTBEAT_TTL": "10"}
    long = step("long", kwargs={"seconds": 60})
    with processes.worker(settings, tmp_path, "w1", env=env) as w1:
        call(client, "chordbeat.apply_schedule", definition={"name": "orphan", "every": 3600, "steps": [long]})
        execution_id = call(client, "chordbeat.trigger_schedule", name="orphan")["execution_id"]
        node = running(client, execution_id, "long")["worker"]
        w1.kill()
    with processes.running(processes.start_worker(settings, tmp_path, "w1", append=True, env=env)):
        wait_for(lambda: len(execution(client, execution_id)["activities"]) == 2, 40, what="the orphan re-queued")
        activities = call(client, "chordbeat.cancel_execution", execution_id=execution_id)["activities"]
    # Re-queued by the starting node itself (no beat runs the periodic recovery here).
    assert (activities[0]["attempt"], activities[0]["error"]) == (1, f"worker lost: {node} restarted")
