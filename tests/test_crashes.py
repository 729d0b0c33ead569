"""Crash things for real: SIGKILL a worker mid-step, restart Redis without its data."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from celery import Celery
from redbeat.schedulers import RedBeatSchedulerEntry

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.messaging.redis_client import get_redis
from tests.support import processes
from tests.support.helpers import call, db_execution, execution, finished, running, step, ts, wait_for
from tests.support.servers import RedisServer

pytestmark = [pytest.mark.slow, pytest.mark.both_databases]


def test_sigkilled_worker_mid_step_is_requeued_and_the_run_completes(
    app: ChordbeatCelery, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    with (
        processes.worker(settings, tmp_path, "w1") as w1,
        processes.worker(settings, tmp_path, "w2") as w2,
        processes.beat(settings, tmp_path),
    ):
        call(
            client,
            "chordbeat.apply_schedule",
            definition={"name": "crash", "every": 3600, "steps": [step("long", kwargs={"seconds": 3}), step("after")]},
        )
        execution_id = call(client, "chordbeat.trigger_schedule", name="crash")["execution_id"]
        victim_node = running(client, execution_id, "long")["worker"]
        victim = w1 if victim_node.startswith("w1@") else w2
        victim.kill()
        killed_at = datetime.now(UTC)
        done = finished(client, execution_id, timeout=60)
    assert done["status"] == "completed", done["error"]
    (first, second), after = done["activities"][:2], done["activities"][2]
    assert (first["attempt"], first["status"]) == (1, "failed_with_error")
    assert first["error"] == f"worker lost: no heartbeat from {victim_node}"
    assert (second["attempt"], second["status"]) == (2, "complete") and second["worker"] != victim_node
    assert after["step"] == "after" and after["status"] == "complete"
    # The re-queued attempt advances the run itself, not a recovery interval later.
    advance_s = (ts(after["started_at"]) - ts(second["completed_at"])).total_seconds()
    assert advance_s < 1.0, advance_s
    requeue_s = (ts(second["started_at"]) - killed_at).total_seconds()
    print(
        f"\nSIGKILL to re-queued attempt running: {requeue_s:.1f}s (TTL {settings.heartbeat_ttl_s}s, "
        f"recovery every {settings.recovery_interval_s}s); advance after re-queued step: {advance_s * 1000:.0f} ms"
    )


def test_a_starting_worker_requeues_its_own_orphaned_steps(
    app: ChordbeatCelery, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    with processes.worker(settings, tmp_path, "w1") as w1:
        call(
            client,
            "chordbeat.apply_schedule",
            definition={"name": "orphan", "every": 3600, "steps": [step("long", kwargs={"seconds": 30})]},
        )
        execution_id = call(client, "chordbeat.trigger_schedule", name="orphan")["execution_id"]
        node = running(client, execution_id, "long")["worker"]
        w1.kill()
    # Same node name again, long before the heartbeat would expire by the default TTL.
    started = time.monotonic()
    with processes.worker(settings, tmp_path, "w1"):
        wait_for(lambda: len(execution(client, execution_id)["activities"]) == 2, 30, what="startup recovery")
        elapsed = time.monotonic() - started
        activities = call(client, "chordbeat.cancel_execution", execution_id=execution_id)["activities"]
    assert activities[0]["error"] == f"worker lost: {node} restarted"
    print(f"\nworker restart to orphan re-queued: {elapsed:.1f}s")


def test_redis_restart_without_data_mid_run_loses_nothing_and_beat_goes_on(
    app: ChordbeatCelery, client: Celery, settings: Settings, tmp_path: Path, redis_server: RedisServer
) -> None:
    from celeryapp.interfaces import service

    with processes.worker(settings, tmp_path, "w1"), processes.beat(settings, tmp_path) as beat:
        call(
            client,
            "chordbeat.apply_schedule",
            definition={
                "name": "through",
                "every": 3600,
                "steps": [step("one"), step("two", kwargs={"seconds": 2}), step("three"), step("four")],
            },
        )
        call(client, "chordbeat.apply_schedule", definition={"name": "ticker", "every": 1, "steps": [step("t")]})
        execution_id = call(client, "chordbeat.trigger_schedule", name="through")["execution_id"]
        running(client, execution_id, "two")
        redis_server.restart()
        restarted = datetime.now(UTC)
        done = wait_for(
            lambda: (e := db_execution(app, execution_id))["status"] != "in_progress" and e,
            60,
            interval=0.3,
            what="the run to finish after the Redis restart",
        )
        # Beat re-takes its lock, entries are rebuilt from the database, and the ticker fires again.
        wait_for(
            lambda: any(ts(e["started_at"]) > restarted for e in service.list_executions(app, "ticker")),
            60,
            interval=0.3,
            what="beat firing after the Redis restart",
        )
        assert beat.proc.poll() is None, "beat exited"
    assert isinstance(done, dict) and done["status"] == "completed", done
    per_step: dict[str, list[str]] = {}
    for activity in done["activities"]:
        per_step.setdefault(activity["step"], []).append(activity["status"])
    # What had finished before the restart ran exactly once.
    assert per_step["one"] == ["complete"]
    assert per_step["three"] == ["complete"] and per_step["four"] == ["complete"]


def test_a_standby_beat_taking_the_lock_after_redis_came_back_empty_rebuilds_every_entry(
    app: ChordbeatCelery, client: Celery, settings: Settings, tmp_path: Path, redis_server: RedisServer
) -> None:
    """The holder dies, then Redis restarts empty while the standby waits for the lock: the
    standby's entries (written when it started) are gone, recovery's own included."""
    from celeryapp.interfaces import service

    service.apply_schedule(app, {"name": "ticker", "every": 1, "steps": [step("t")]})
    with (
        processes.worker(settings, tmp_path, "w1"),
        processes.beat(settings, tmp_path, "beat-a") as a,
        processes.beat(settings, tmp_path, "beat-b") as b,
    ):
        holder = wait_for(
            lambda: next((p for p in (a, b) if "acquired lock" in p.output()), None), 30, what="a lock holder"
        )
        assert isinstance(holder, processes.Process)
        standby = b if holder is a else a
        # Set up (entries written) and waiting for the lock.
        wait_for(lambda: "standing by" in standby.output(), 30, what="the other beat to stand by")
        wait_for(lambda: service.list_executions(app, "ticker"), 30, interval=0.2, what="a first fire")
        holder.kill()
        redis_server.outage(4)
        back = datetime.now(UTC)
        wait_for(lambda: "acquired lock" in standby.output(), 30, interval=0.2, what="the standby to take the lock")
        wait_for(
            lambda: any(ts(e["started_at"]) > back for e in service.list_executions(app, "ticker")),
            30,
            interval=0.3,
            what="the standby firing after Redis came back empty",
        )
    recover_entry = RedBeatSchedulerEntry.generate_key(app, "chordbeat-recover")
    assert get_redis(app.settings.redbeat_url).exists(recover_entry), "recovery's own entry was not rebuilt"
