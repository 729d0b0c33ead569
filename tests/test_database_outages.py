"""PostgreSQL stopped for seconds while a step claims or finishes, as a restart or a failover
does: the runner waits for it, with its heartbeat (or its message's pickup lease) kept, and the
step runs once and is recorded as it ended."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy.engine import make_url

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.worker.dispatch import apply_effects
from tests.support import processes
from tests.support.fault_tasks import read_log
from tests.support.helpers import call, db_execution, start_and_hold, ts, wait_for
from tests.support.servers import PostgresServer

pytestmark = [pytest.mark.slow, pytest.mark.both_databases]

#: The outage: longer than the old runner's patience (about 1.2 s) and than the heartbeat's TTL
#: (3 s here); ``CHORDBEAT_TEST_DB_OUTAGE_S=60`` checks the longest routine failover.
OUTAGE_S = float(os.environ.get("CHORDBEAT_TEST_DB_OUTAGE_S", "8"))


@pytest.fixture
def postgres(settings: Settings, request: pytest.FixtureRequest) -> PostgresServer:
    if make_url(settings.database_url).get_backend_name() != "postgresql":
        pytest.skip("a database server stopped and started again is PostgreSQL's")
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return server


@contextlib.contextmanager
def stopped(server: PostgresServer) -> Iterator[float]:
    """PostgreSQL stopped (``-m fast``: every connection closed) until the block ends, at least
    ``OUTAGE_S`` after it stopped; yields when it stopped (``time.time()``)."""
    server.stop_server("fast")
    down = time.time()
    try:
        yield down
    finally:
        time.sleep(max(0.0, down + OUTAGE_S - time.time()))  # the outage's length, not a synchronisation
        server.start_server()


def tick(log: Path, seconds: float, **extra: Any) -> dict[str, Any]:
    return {"name": "long", "task": "faults.tick", "kwargs": {"log": str(log), "seconds": seconds}, **extra}


def ended(app: ChordbeatCelery, execution_id: int) -> dict[str, Any]:
    done = wait_for(
        lambda: (e := db_execution(app, execution_id))["status"] != "in_progress" and e,
        60,
        interval=0.2,
        what=f"execution {execution_id} to end",
    )
    assert isinstance(done, dict)
    return done


@pytest.mark.parametrize("timeout", [None, 2], ids=["no-timeout", "soft-limit-meanwhile"])
def test_a_step_finishing_while_the_database_is_stopped_is_recorded_complete_once(
    app: ChordbeatCelery,
    client: Celery,
    settings: Settings,
    tmp_path: Path,
    postgres: PostgresServer,
    timeout: int | None,
) -> None:
    """Before: the runner left its heartbeat watch, tried the outcome for about 1.2 s, then could
    not even write its stand-in failure; recovery found the heartbeat gone once the database was
    back, recorded the completed step ``worker lost`` and ran it again as attempt 2.

    With a timeout, the step's soft time limit falls while its outcome waits: the step is over,
    and the runner goes on trying (until the hard limit, the timeout + 30 s)."""
    if timeout is not None and timeout + 25 < OUTAGE_S:
        pytest.skip("Celery's hard time limit (the timeout + 30 s) ends a longer wait: docs/reliability.md")
    log = tmp_path / "steps.log"
    long = tick(log, 1.5, timeout=timeout) if timeout else tick(log, 2)
    definition = {
        "name": "finishing",
        "every": 3600,
        "steps": [long, {"name": "after", "task": "chordbeat.examples.sleep", "kwargs": {"seconds": 0.05}}],
    }
    with (
        processes.worker(settings, tmp_path, "w1", env=processes.FAULT_TASKS_ENV) as w1,
        processes.beat(settings, tmp_path),
    ):
        call(client, "chordbeat.apply_schedule", definition=definition)
        execution_id = call(client, "chordbeat.trigger_schedule", name="finishing")["execution_id"]
        wait_for(lambda: any(e["event"] == "tick" for e in read_log(str(log))), 30, what="the step to run")
        with stopped(postgres) as down:
            wait_for(lambda: any(e["event"] == "end" for e in read_log(str(log))), 10, what="the step to end")
        back = time.time()
        done = ended(app, execution_id)
        output = w1.output()
    events = read_log(str(log))
    assert [e["attempt"] for e in events if e["event"] == "start"] == [1], "the step ran again"
    (end,) = [e for e in events if e["event"] == "end"]
    assert down < end["t"] < back, "the step did not end while the database was stopped"
    assert done["status"] == "completed", done
    assert [(a["step"], a["attempt"], a["status"]) for a in done["activities"]] == [
        ("long", 1, "complete"),
        ("after", 1, "complete"),
    ]
    after = ts(done["activities"][1]["started_at"]).timestamp()
    print(f"\ndatabase back ({OUTAGE_S:g}s outage) to the next step running: {after - back:.1f}s")
    assert "recording the outcome (complete) of 'long' attempt 1 failed" in output
    # Logged at the first failure and then every 30 s, not at every try.
    assert output.count("recording the outcome (complete) of 'long' attempt 1 failed") <= 1 + OUTAGE_S // 30


def test_a_step_claimed_while_the_database_is_stopped_runs_once_from_its_own_message(
    app: ChordbeatCelery, client: Celery, settings: Settings, tmp_path: Path, postgres: PostgresServer
) -> None:
    """Before: the claim gave up after about 0.7 s and dropped its pickup lease; recovery sent the
    attempt again once the database was back (``sent again``), so a database outage cost a step
    its message and a recovery interval, and made two messages of one attempt."""
    log = tmp_path / "steps.log"
    with (
        processes.worker(settings, tmp_path, "w1", env=processes.FAULT_TASKS_ENV) as w1,
        processes.beat(settings, tmp_path),
    ):
        call(
            client,
            "chordbeat.apply_schedule",
            definition={"name": "claiming", "every": 3600, "steps": [tick(log, 0.3)]},
        )
        execution_id, effects = start_and_hold(app, "claiming")
        with stopped(postgres):
            apply_effects(app, effects)
            wait_for(lambda: "claiming worker task" in w1.output(), 20, what="the claim to fail")
        done = ended(app, execution_id)
        output = w1.output()
    assert done["status"] == "completed", done
    assert [(a["attempt"], a["status"]) for a in done["activities"]] == [(1, "complete")]
    assert [e["attempt"] for e in read_log(str(log)) if e["event"] == "start"] == [1]
    assert "could not claim" not in output
    assert "sent again" not in output, "recovery had to send the attempt again"
