"""PostgreSQL fails over to its streaming standby while steps claim and finish (issue 35, item 4).

The lab (tests/support/standby.py): a primary, a standby made with ``pg_basebackup -R`` streaming through a
relay the test can cut, and the address chordbeat uses, moved to the standby once it is promoted
(a virtual IP). A real worker runs the chaos suite's step task, which logs each body's start and
end (tests/support/chaos_tasks.py).

Synchronous replication (``synchronous_standby_names`` and ``synchronous_commit = on``): nothing
acknowledged is lost; every step body runs once, the one running across the failover included.

Asynchronous: replication is cut while the primary goes on committing (a lagging standby), then the
primary dies. What it committed meanwhile is lost: a run cancelled there, a run completed there, a
step claimed and finished there. Its ids are handed out again by the promoted standby (its
sequences know nothing of them): the run given the cancelled run's id runs to its end, the step
whose claim and outcome were lost runs again but never beside itself, and the next recovery pass
says CRITICAL and moves the sequences past the ids Redis saw.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.interfaces import service
from celeryapp.recovery import database_rollback, recovery
from models import ScheduleExecution, transaction
from models.migrate import upgrade
from tests.support import processes
from tests.support.chaos_tasks import STEP_TASK
from tests.support.servers import RedisServer, wait_for
from tests.support.standby import ReplicatedPostgres, run_sql

TABLES = ("schedule_executions", "worker_tasks", "activities")
#: A step queue only the second worker takes.
HELD = "held"
#: Ids a PostgreSQL sequence logs ahead of the one it hands out (SEQ_LOG_VALS): a standby knows
#: them as used, and hands out again only ids drawn past them.
SEQUENCE_LOG_AHEAD = 32
#: How long the step claimed on the lost timeline runs.
CLAIMED_STEP_S = 3


@pytest.fixture
def replicated(request: pytest.FixtureRequest) -> Iterator[ReplicatedPostgres]:
    lab = ReplicatedPostgres(synchronous=request.param)
    try:
        run_sql(lab.primary.url(), "CREATE DATABASE chordbeat")
        upgrade(lab.primary.url("chordbeat"))
        lab.wait_replayed()
        yield lab
    finally:
        lab.close()


@pytest.fixture
def settings(redis_server: RedisServer, replicated: ReplicatedPostgres, tmp_path: Path) -> Settings:
    return Settings(
        broker_url=redis_server.url,
        result_backend=redis_server.url,
        redbeat_url=redis_server.url,
        database_url=replicated.url("chordbeat"),
        heartbeat_ttl_s=3,
        recovery_interval_s=1,
        health_dir=str(tmp_path),
        task_modules=("tests.support.chaos_tasks",),
    )


def _schedule(app: ChordbeatCelery, name: str, log: Path, seconds: float, queue: str | None = None) -> None:
    kwargs = {"log": str(log), "sleep_min": seconds, "sleep_max": seconds}
    step = {"name": "a", "task": STEP_TASK, "kwargs": kwargs, **({"queue": queue} if queue else {})}
    service.apply_schedule(app, {"name": name, "every": 3600, "overlap": "allow", "steps": [step]})


def _bodies(log: Path, schedule: str) -> list[dict[str, Any]]:
    """Each body of the schedule's steps: its start and end (``None`` while it runs)."""
    if not log.exists():
        return []
    bodies: list[dict[str, Any]] = []
    for line in log.read_text().splitlines():
        event = json.loads(line)
        if event.get("schedule") != schedule:
            continue
        if event["event"] == "start":
            bodies.append({"attempt": event["attempt"], "start": event["t"], "end": None, "pid": event["pid"]})
        else:
            started = next(b for b in reversed(bodies) if b["pid"] == event["pid"] and b["end"] is None)
            started["end"] = event["t"]
    return bodies


def _started(log: Path, schedule: str) -> None:
    wait_for(lambda: _bodies(log, schedule), 30, interval=0.05, what=f"{schedule}'s step to start")


def _status(app: ChordbeatCelery, execution_id: int) -> str | None:
    with transaction(app.settings.database_url, read_only=True) as session:
        status = session.scalar(select(ScheduleExecution.status).where(ScheduleExecution.id == execution_id))
    return None if status is None else status.value


def _ended(app: ChordbeatCelery, execution_id: int) -> str:
    def ended() -> str | None:
        status = _status(app, execution_id)
        return status if status not in (None, "in_progress") else None

    result = wait_for(ended, 60, interval=0.1, what=f"execution {execution_id} to end")
    assert isinstance(result, str)
    return result


def _never_beside_itself(bodies: list[dict[str, Any]]) -> None:
    spans = sorted((b["start"], b["end"]) for b in bodies)
    assert all(end is not None for _start, end in spans), spans
    assert all(earlier[1] <= later[0] for earlier, later in itertools.pairwise(spans)), spans


@pytest.mark.timeout(300)
@pytest.mark.parametrize("replicated", [True], indirect=True, ids=["synchronous"])
def test_a_failover_to_a_synchronous_standby_loses_nothing(
    app: ChordbeatCelery, replicated: ReplicatedPostgres, settings: Settings, tmp_path: Path
) -> None:
    log = tmp_path / "steps.jsonl"
    _schedule(app, "across", log, 4)
    _schedule(app, "before", log, 0.1)
    assert replicated.sync_state() == "sync"
    with processes.worker(settings, tmp_path, "w1", concurrency=4):
        before = service.trigger_schedule(app, "before")["execution_id"]
        assert _ended(app, before) == "completed"
        across = service.trigger_schedule(app, "across")["execution_id"]
        _started(log, "across")
        replicated.fail_over()
        promoted = time.time()
        assert _bodies(log, "across")[0]["end"] is None  # the step runs across the failover
        assert _ended(app, across) == "completed"
        ended = _bodies(log, "across")[0]["end"] - promoted
        print(f"\nsynchronous: the step across the promotion ended {ended:.2f}s after it")
        report = recovery.recover(app)
        assert not report.repairs_paused
    assert [b["attempt"] for b in _bodies(log, "across")] == [1]
    assert [b["attempt"] for b in _bodies(log, "before")] == [1]


def _log_a_fresh_value(url: str) -> None:
    """A checkpoint, then one id of each sequence: each logs its value ahead (WAL) afresh, so the
    standby knows exactly which ids it will hand out after a promotion."""
    run_sql(url, "CHECKPOINT", *(f"SELECT nextval(pg_get_serial_sequence('{t}', 'id'))" for t in TABLES))


def _draw_what_the_standby_knows(url: str) -> None:
    """A busy primary's last moments: the ids the standby already counts as used are drawn, so
    that the next ones are ids the promoted standby hands out again."""
    draws = f"SELECT max(nextval(pg_get_serial_sequence('{{t}}', 'id'))) FROM generate_series(1, {SEQUENCE_LOG_AHEAD})"
    run_sql(url, *(draws.format(t=t) for t in TABLES))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("replicated", [False], indirect=True, ids=["asynchronous"])
def test_a_failover_to_an_asynchronous_standby_reuses_no_state_and_runs_nothing_twice_at_once(
    app: ChordbeatCelery,
    replicated: ReplicatedPostgres,
    settings: Settings,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = tmp_path / "steps.jsonl"
    primary_url = replicated.primary.url("chordbeat")
    for name, seconds in (("cancelled", 30), ("done", 0.1), ("fresh", 1)):
        _schedule(app, name, log, seconds)
    # Its step waits in a queue no worker takes until replication is cut: claimed on the lost timeline.
    # Its first body is stopped within a recovery interval by its attempt's check (the database no
    # longer holds its claim), its second runs whole: short, so that the test does not wait for it.
    _schedule(app, "claimed", log, CLAIMED_STEP_S, queue=HELD)
    assert replicated.sync_state() == "async"
    with processes.worker(settings, tmp_path, "w1", concurrency=4):
        claimed = service.trigger_schedule(app, "claimed")["execution_id"]
        _log_a_fresh_value(primary_url)
        replicated.wait_replayed()
        replicated.relay.hold()
        _draw_what_the_standby_knows(primary_url)
        cancelled = service.trigger_schedule(app, "cancelled")["execution_id"]
        _started(log, "cancelled")
        service.cancel_execution(app, cancelled)
        assert _ended(app, cancelled) == "cancelled"
        done = service.trigger_schedule(app, "done")["execution_id"]
        assert _ended(app, done) == "completed"
        with processes.step_worker(settings, tmp_path, "w2", queues=HELD):
            _started(log, "claimed")
            replicated.fail_over()
            promoted = time.time()
            # Before any recovery pass: the promoted standby hands the lost runs' ids out again.
            fresh = service.trigger_schedule(app, "fresh")["execution_id"]
            assert fresh == cancelled
            assert _ended(app, fresh) == "completed"  # the lost run's cancel flag did not stop it
            with caplog.at_level(logging.CRITICAL, logger=database_rollback.__name__):
                assert recovery.recover(app).repairs_paused
            assert "the database went back" in caplog.text
            after = service.trigger_schedule(app, "fresh")["execution_id"]
            assert after > done + database_rollback.SEQUENCE_MARGIN
            # The claimed step runs on; sent again only once it ended.
            wait_for(lambda: _recovered(app, claimed), 60, interval=0.5, what="the claimed run to complete")
        assert _ended(app, after) == "completed"
    # The run cancelled and the run completed on the lost timeline are gone with it (their bodies
    # ran once); the runs given their ids ran whole.
    assert [b["attempt"] for b in _bodies(log, "cancelled")] == [1]
    assert [b["attempt"] for b in _bodies(log, "done")] == [1]
    assert _status(app, done) is None
    assert [b["end"] is not None for b in _bodies(log, "fresh")] == [True, True]
    # The step whose claim and outcome were lost ran again, after itself, never beside.
    bodies = _bodies(log, "claimed")
    assert [b["attempt"] for b in bodies] == [1, 1]
    _never_beside_itself(bodies)
    print(
        f"\nasynchronous: first body {_bodies(log, 'fresh')[0]['start'] - promoted:.2f}s after the promotion; "
        f"the lost claim's step ran again {bodies[1]['start'] - bodies[0]['end']:.2f}s after its first body ended"
    )


def _recovered(app: ChordbeatCelery, execution_id: int) -> bool:
    recovery.recover(app)
    return _status(app, execution_id) == "completed"
