"""Recovery without crashing processes: stuck executions, lost messages, timeouts, own-node recovery
(by heartbeat: a live worker sharing the node name keeps its steps)."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import select, update

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.domain.names import PREFIX, STEPS_QUEUE
from celeryapp.execution.runs import start_execution
from celeryapp.execution.steps import claim_step, finish_step
from celeryapp.interfaces import service
from celeryapp.messaging import keys, unacked
from celeryapp.messaging.redis_client import get_redis
from celeryapp.recovery import heartbeat_trust, node_start, recovery
from celeryapp.recovery.housekeeping import purge
from models import (
    Activity,
    ActivityStatus,
    Schedule,
    ScheduleExecution,
    Trigger,
    WorkerTask,
    transaction,
    utcnow,
)
from tests.support import processes
from tests.support.helpers import (
    call,
    db_execution,
    entry_exists,
    execution,
    finished,
    running,
    step,
    token_of_task,
    wait_for,
)


def start_without_dispatch(app: ChordbeatCelery, name: str) -> int:
    """An execution recorded in the database whose first chord was never sent (a crash after commit)."""
    with transaction(app.settings.database_url) as session:
        schedule = session.scalar(select(Schedule).where(Schedule.name == name))
        assert schedule is not None
        result = start_execution(session, schedule, trigger=Trigger.MANUAL, run_key=f"{name}:lost", now=utcnow())
    assert result.execution_id is not None
    return result.execution_id


def backdate(app: ChordbeatCelery, execution_id: int, seconds: float = 60) -> None:
    from datetime import timedelta

    with transaction(app.settings.database_url) as session:
        past = utcnow() - timedelta(seconds=seconds)
        session.execute(update(ScheduleExecution).where(ScheduleExecution.id == execution_id).values(started_at=past))
        session.execute(
            update(WorkerTask).where(WorkerTask.execution_id == execution_id).values(queued_at=past, started_at=past)
        )
        session.execute(update(Activity).where(Activity.execution_id == execution_id).values(started_at=past))
        session.execute(
            update(Activity)
            .where(Activity.execution_id == execution_id, Activity.completed_at.is_not(None))
            .values(completed_at=past)
        )


def recovery_has_been_running(app: ChordbeatCelery) -> None:
    """As if the periodic recovery had been running all along (no gap, so heartbeats count)."""
    client = get_redis(app.settings.broker_url)
    client.set(heartbeat_trust.RECOVERY_SEEN_KEY, "1", ex=60)
    client.delete(heartbeat_trust.HEARTBEAT_GRACE_KEY)


def test_a_queued_step_whose_message_never_left_is_sent_again(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    call(client, "chordbeat.apply_schedule", definition={"name": "lost", "every": 60, "steps": [step("a"), step("b")]})
    execution_id = start_without_dispatch(app, "lost")
    backdate(app, execution_id)
    report = recovery.recover(app)
    assert len(report.resent) == 1
    done = finished(client, execution_id)
    assert done["status"] == "completed"
    assert [(a["step"], a["attempt"]) for a in done["activities"]] == [("a", 1), ("b", 1)]
    assert recovery.recover(app).resent == []


def test_a_pass_while_another_one_runs_does_nothing(app: ChordbeatCelery, worker: Any, client: Celery) -> None:
    # Passes over a large backlog outlasted the interval and ran side by side (docs/scaling.md).
    call(client, "chordbeat.apply_schedule", definition={"name": "leased", "every": 60, "steps": [step("a")]})
    execution_id = start_without_dispatch(app, "leased")
    backdate(app, execution_id)
    other = get_redis(app.settings.broker_url).lock(
        f"{PREFIX}:recovery:lease", timeout=30, blocking=False, thread_local=False
    )
    assert other.acquire()
    try:
        report = recovery.recover(app)
        assert report.resent == []
        assert report.skipped
    finally:
        other.release()
    assert len(recovery.recover(app).resent) == 1
    assert finished(client, execution_id)["status"] == "completed"


def test_a_stuck_execution_is_advanced_by_recovery(app: ChordbeatCelery, worker: Any, client: Celery) -> None:
    call(client, "chordbeat.apply_schedule", definition={"name": "stuck", "every": 60, "steps": [step("a"), step("b")]})
    execution_id = start_without_dispatch(app, "stuck")
    # Group 0 ran and recorded its outcome, but the chord body (advancement) was lost.
    with transaction(app.settings.database_url) as session:
        task_id = session.scalar(select(WorkerTask.id).where(WorkerTask.step_name == "a"))
        assert task_id is not None
        claim = claim_step(session.connection(), task_id, 1, node="gone@host", now=utcnow())
        assert claim is not None
        finish_step(session.connection(), claim, ActivityStatus.COMPLETE, now=utcnow())
    backdate(app, execution_id)
    assert execution(client, execution_id)["current_step_index"] == 0
    report = recovery.recover(app)
    assert report.unstuck == [execution_id]
    done = finished(client, execution_id)
    assert done["status"] == "completed" and [a["step"] for a in done["activities"]] == ["a", "b"]


def test_a_run_whose_last_step_just_ended_is_not_taken_for_stuck(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    """Under load the advancement may still be queued: the grace counts from the last progress."""
    call(client, "chordbeat.apply_schedule", definition={"name": "busy", "every": 60, "steps": [step("a"), step("b")]})
    execution_id = start_without_dispatch(app, "busy")
    backdate(app, execution_id)  # a run started long ago ...
    with transaction(app.settings.database_url) as session:
        task_id = session.scalar(select(WorkerTask.id).where(WorkerTask.step_name == "a"))
        assert task_id is not None
        claim = claim_step(session.connection(), task_id, 1, node="w@host", now=utcnow())
        assert claim is not None
        finish_step(session.connection(), claim, ActivityStatus.COMPLETE, now=utcnow())  # ... whose step just ended
    assert recovery.recover(app).unstuck == []
    backdate(app, execution_id)  # no progress for a while: now it is stuck
    assert recovery.recover(app).unstuck == [execution_id]
    assert finished(client, execution_id)["status"] == "completed"


def test_a_processing_step_without_heartbeat_is_requeued_and_its_late_message_does_nothing(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    call(client, "chordbeat.apply_schedule", definition={"name": "lostworker", "every": 60, "steps": [step("a")]})
    execution_id = start_without_dispatch(app, "lostworker")
    with transaction(app.settings.database_url) as session:
        task_id = session.scalar(select(WorkerTask.id).where(WorkerTask.execution_id == execution_id))
        assert task_id is not None
        assert claim_step(session.connection(), task_id, 1, node="crashed@host", now=utcnow()) is not None
    backdate(app, execution_id)
    recovery_has_been_running(app)
    report = recovery.recover(app)
    assert report.requeued == [task_id]
    done = finished(client, execution_id)
    assert done["status"] == "completed"
    assert [(a["attempt"], a["status"], a["error"]) for a in done["activities"]] == [
        (1, "failed_with_error", "worker lost: no heartbeat from crashed@host"),
        (2, "complete", None),
    ]
    # The interrupted attempt's message, redelivered late by the broker: fenced off.
    assert app.send_task("chordbeat.run_step", args=(task_id, 1), ignore_result=False).get(timeout=10) == {
        "status": "skipped"
    }
    assert execution(client, execution_id) == done


def test_missing_heartbeats_count_only_a_ttl_after_recovery_could_run_again(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    """After Redis (or beat) was away, running steps need a moment to write their heartbeats again."""
    call(client, "chordbeat.apply_schedule", definition={"name": "gap", "every": 60, "steps": [step("a")]})
    execution_id = start_without_dispatch(app, "gap")
    with transaction(app.settings.database_url) as session:
        task_id = session.scalar(select(WorkerTask.id).where(WorkerTask.execution_id == execution_id))
        assert task_id is not None
        claim_step(session.connection(), task_id, 1, node="crashed@host", now=utcnow())
    backdate(app, execution_id)
    # Redis was just flushed: this is recovery's first pass after a gap.
    started = time.monotonic()
    assert recovery.recover(app).requeued == []
    wait_for(lambda: recovery.recover(app).requeued == [task_id], 10, interval=0.2, what="the grace to end")
    assert time.monotonic() - started >= app.settings.heartbeat_ttl_s - 0.5
    assert finished(client, execution_id)["status"] == "completed"


def test_a_step_out_of_attempts_fails_under_the_normal_rules(app: ChordbeatCelery, worker: Any, client: Celery) -> None:
    call(
        client,
        "chordbeat.apply_schedule",
        definition={"name": "poison", "every": 60, "steps": [step("a", max_attempts=1), step("b")]},
    )
    execution_id = start_without_dispatch(app, "poison")
    with transaction(app.settings.database_url) as session:
        task_id = session.scalar(select(WorkerTask.id).where(WorkerTask.step_name == "a"))
        assert task_id is not None
        claim_step(session.connection(), task_id, 1, node="crashed@host", now=utcnow())
    backdate(app, execution_id)
    recovery_has_been_running(app)
    recovery.recover(app)
    failed = execution(client, execution_id)
    assert failed["status"] == "failed"
    assert failed["error"] == "step 'a' failed: worker lost: no heartbeat from crashed@host"
    assert failed["tasks"] == []


def test_a_live_heartbeat_keeps_a_long_step_running(app: ChordbeatCelery, worker: Any, client: Celery) -> None:
    call(
        client,
        "chordbeat.apply_schedule",
        definition={"name": "long", "every": 60, "steps": [step("a", kwargs={"seconds": 30})]},
    )
    execution_id = call(client, "chordbeat.trigger_schedule", name="long")["execution_id"]
    running(client, execution_id, "a")
    backdate(app, execution_id)
    assert recovery.recover(app).requeued == []
    call(client, "chordbeat.cancel_execution", execution_id=execution_id)


def test_execution_timeout_cancels_and_fails_the_run(app: ChordbeatCelery, worker: Any, client: Celery) -> None:
    call(
        client,
        "chordbeat.apply_schedule",
        definition={
            "name": "slowrun",
            "every": 60,
            "timeout": 1,
            "steps": [step("a", kwargs={"seconds": 30}), step("b")],
        },
    )
    execution_id = call(client, "chordbeat.trigger_schedule", name="slowrun")["execution_id"]
    running(client, execution_id, "a")
    wait_for(lambda: recovery.recover(app).timed_out, 10, interval=0.2, what="the execution deadline")
    result = execution(client, execution_id)
    assert result["status"] == "failed" and result["error"] == "execution timed out after 1s"
    assert [a["status"] for a in result["activities"]] == ["cancelled"]
    schedule = call(client, "chordbeat.get_schedule", name="slowrun")
    assert schedule["error_count"] == 1


def test_step_timeout_fails_the_step_with_a_clear_error(app: ChordbeatCelery, worker: Any, client: Celery) -> None:
    call(
        client,
        "chordbeat.apply_schedule",
        definition={"name": "slowstep", "every": 60, "steps": [step("a", kwargs={"seconds": 30}, timeout=0.5)]},
    )
    execution_id = call(client, "chordbeat.trigger_schedule", name="slowstep")["execution_id"]
    result = finished(client, execution_id, timeout=10)
    assert result["status"] == "failed"
    assert result["error"] == "step 'a' failed: timed out after 0.5s"


def test_startup_recovery_takes_only_the_starting_nodes_steps(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    ids = _two_runs(app)
    long_ago = utcnow() - timedelta(seconds=60)
    with transaction(app.settings.database_url) as session:
        tasks = list(session.scalars(select(WorkerTask).order_by(WorkerTask.id)))
        claim_step(session.connection(), tasks[0].id, 1, node="me@host", now=long_ago)
        claim_step(session.connection(), tasks[1].id, 1, node="other@host", now=long_ago)
    start = node_start.recover_node(app, "me@host")
    assert start.report.requeued == [tasks[0].id] and not start.pending
    assert finished(client, ids[0])["status"] == "completed"
    other = execution(client, ids[1])
    assert other["status"] == "in_progress" and other["tasks"][0]["status"] == "processing"


def _two_runs(app: ChordbeatCelery) -> list[int]:
    service.apply_schedule(app, {"name": "nodes", "every": 60, "overlap": "allow", "steps": [step("a")]})
    return [start_without_dispatch(app, "nodes"), _second(app)]


def test_startup_recovery_leaves_a_step_whose_heartbeat_another_live_worker_refreshes(
    app: ChordbeatCelery, worker: Any, client: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    """Two workers given the same node name: the one starting takes nothing the other runs. A step
    whose heartbeat is still counting down is watched (refreshed: the other's); a claim too fresh to
    have its first heartbeat yet is waited for a TTL. (An expiring heartbeat: test_node_names.)"""
    ids = _two_runs(app)
    redis_client = get_redis(app.settings.broker_url)
    with transaction(app.settings.database_url) as session:
        tasks = [t.id for t in session.scalars(select(WorkerTask).order_by(WorkerTask.id))]
        claim_step(session.connection(), tasks[0], 1, node="twin@host", now=utcnow() - timedelta(seconds=60))
        claim_step(session.connection(), tasks[1], 1, node="twin@host", now=utcnow())
    live = keys.heartbeat_key(tasks[0], 1, token_of_task(app, tasks[0]))
    redis_client.set(live, "1", px=60_000)
    start = node_start.recover_node(app, "twin@host")
    assert not start.report.requeued and [w.worker_task_id for w in start.pending] == tasks
    # The other worker refreshes its step's heartbeat.
    redis_client.set(live, "1", px=60_100)
    with caplog.at_level(logging.ERROR, logger=node_start.__name__):
        assert start.check_heartbeats()
    assert [w.worker_task_id for w in start.pending] == [tasks[1]] and start.duplicate
    assert "twin@host is also the name of another live worker" in caplog.text
    # A TTL after its claim, the fresh one still has no heartbeat: its worker died before the first.
    assert not start.check_heartbeats(now=utcnow() + timedelta(seconds=app.settings.heartbeat_ttl_s + 1))
    assert start.report.requeued == [tasks[1]]
    lost, again = finished(client, ids[1])["activities"]
    assert (lost["attempt"], lost["error"], again["status"]) == (1, "worker lost: twin@host restarted", "complete")
    assert execution(client, ids[0])["tasks"][0]["status"] == "processing"
    with transaction(app.settings.database_url) as session:
        assert session.get_one(WorkerTask, tasks[0]).attempt == 1
    redis_client.delete(live)


def _second(app: ChordbeatCelery) -> int:
    with transaction(app.settings.database_url) as session:
        schedule = session.scalar(select(Schedule).where(Schedule.name == "nodes"))
        assert schedule is not None
        result = start_execution(session, schedule, trigger=Trigger.MANUAL, run_key="nodes:two", now=utcnow())
    assert result.execution_id is not None
    return result.execution_id


def test_housekeeping_deletes_old_finished_runs_in_batches(app: ChordbeatCelery, worker: Any, client: Celery) -> None:
    from datetime import timedelta

    call(client, "chordbeat.apply_schedule", definition={"name": "old", "every": 60, "steps": [step("a")]})
    ids = [call(client, "chordbeat.trigger_schedule", name="old")["execution_id"]]
    finished(client, ids[0])
    ids.append(call(client, "chordbeat.trigger_schedule", name="old")["execution_id"])
    finished(client, ids[1])
    with transaction(app.settings.database_url) as session:
        session.execute(
            update(ScheduleExecution)
            .where(ScheduleExecution.id == ids[0])
            .values(completed_at=utcnow() - timedelta(days=91))
        )
    assert purge(app, batch=1).executions == 1
    with transaction(app.settings.database_url) as session:
        assert list(session.scalars(select(ScheduleExecution.id))) == [ids[1]]
        assert {a.execution_id for a in session.scalars(select(Activity))} == {ids[1]}


def test_redis_epoch_loss_rebuilds_beat_entries(
    app: ChordbeatCelery, worker: Any, client: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    # A fresh start (nothing stored, a new Redis): a first pass with nothing to report, not a WARNING.
    with caplog.at_level(logging.INFO, logger="celeryapp.recovery.recovery"):
        first = recovery.recover(app)
    assert first.redis_reset and first.empty, first
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "celeryapp.recovery.recovery"]
    assert said == [
        (logging.INFO, "recovery: first pass on this Redis (no epoch mark yet); beat entries checked, none missing")
    ], said
    call(client, "chordbeat.apply_schedule", definition={"name": "kept", "every": 60, "steps": [step("a")]})
    recovery.recover(app)
    get_redis(app.settings.redbeat_url).flushall()
    assert not entry_exists(app, "kept")
    caplog.clear()
    lost = recovery.recover(app)
    assert lost.redis_reset and lost.entries_rebuilt == ["kept"], lost
    warned = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.name == "celeryapp.recovery.recovery"
    ]
    assert warned and "kept" in warned[0], warned
    assert entry_exists(app, "kept")
    assert not recovery.recover(app).redis_reset


def test_an_outcome_that_cannot_be_recorded_is_not_replaced_by_a_failure_the_step_did_not_have(
    app: ChordbeatCelery, worker: Any, client: Celery, monkeypatch: Any
) -> None:
    """An error trying again cannot cure is given up at once (a database away is waited for: see
    tests/test_database_outages.py). The activity stays in progress, its heartbeat goes, and
    recovery runs the step again as after a lost worker. (It used to be recorded
    ``failed_with_error: outcome could not be recorded``, a failure the step did not have.)"""
    from celeryapp.worker import runner

    def broken(*_args: Any, **_kwargs: Any) -> bool:
        raise RuntimeError("a bug while recording")

    monkeypatch.setattr(runner, "finish_step", broken)
    call(client, "chordbeat.apply_schedule", definition={"name": "safe", "every": 60, "steps": [step("a")]})
    execution_id = call(client, "chordbeat.trigger_schedule", name="safe")["execution_id"]
    redis_client = get_redis(app.settings.broker_url)
    wait_for(
        lambda: execution(client, execution_id)["activities"] and not redis_client.keys(f"{PREFIX}:hb:*"),
        10,
        what="the runner to give up and its heartbeat to go",
    )
    (activity,) = execution(client, execution_id)["activities"]
    assert activity["status"] == "in_progress"
    backdate(app, execution_id)
    monkeypatch.undo()
    recovery_has_been_running(app)
    assert recovery.recover(app).requeued
    done = finished(client, execution_id)
    assert done["status"] == "completed"
    assert [(a["attempt"], a["status"]) for a in done["activities"]] == [(1, "failed_with_error"), (2, "complete")]


def test_the_worker_keeps_its_liveness_file_fresh(app: ChordbeatCelery, worker: Any) -> None:
    from celeryapp.monitoring.health import age_s

    age = age_s(app.settings, "worker")
    assert age is not None and age < 15


def test_a_step_message_taken_by_a_worker_that_died_before_noting_it_is_sent_again(
    app: ChordbeatCelery, settings: Settings, tmp_path: Path
) -> None:
    """SIGKILL between the broker handing a worker the message and the worker noting its pickup:
    the dispatch marker says the message is on its way, kombu holds it as unacknowledged for its
    visibility timeout (hours), and the run would wait that long."""
    service.apply_schedule(app, {"name": "stranded", "every": 3600, "steps": [step("a")]})
    execution_id = service.trigger_schedule(app, "stranded")["execution_id"]
    later = utcnow() + timedelta(seconds=recovery.RESEND_GRACE_S + settings.heartbeat_ttl_s + 1)
    # Still in the queue: on its way, not sent twice.
    assert recovery.recover(app, now=later).resent == []
    # A consumer takes it (into kombu's unacknowledged set) and dies without a word.
    taker = (
        "import os\nfrom kombu import Connection\n"
        f"with Connection({settings.broker_url!r}, transport_options={app.conf.broker_transport_options!r}) as c:\n"
        f"    assert c.default_channel.basic_get({STEPS_QUEUE!r}) is not None\n"
        "    os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", taker], check=True, timeout=60)
    redis_client = get_redis(settings.broker_url)
    taken_tags = redis_client.hkeys(unacked.UNACKED_KEY)
    assert len(taken_tags) == 1
    with processes.worker(settings, tmp_path, "w1"):
        report = recovery.recover(app, now=later)
        assert len(report.resent) == 1
        wait_for(lambda: db_execution(app, execution_id)["status"] == "completed", 60, what="the run to complete")
    # Sent again, so kombu must not also put the old message back. (Only the dead taker's entry is
    # checked: the worker's own last acknowledgement may still be on its way when the run completes.)
    assert not redis_client.hexists(unacked.UNACKED_KEY, taken_tags[0])
