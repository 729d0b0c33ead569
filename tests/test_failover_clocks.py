"""Redis fails over to a replica whose clock is not the primary's (another host). Redis keeps a
key's expiry as an absolute time and the replica inherits it, so the new primary expires keys by
its own clock: ahead, every running step's heartbeat is gone at once; behind, a dead worker's
lives on for as much longer. Recovery notices the primary changed and neither re-runs a healthy
step nor loses a dead worker's."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import redis

from celeryapp.application import ChordbeatCelery
from celeryapp.client import ChordbeatClient
from celeryapp.config import Settings
from celeryapp.messaging.redis_client import get_redis, reset_clients
from celeryapp.recovery.heartbeat_trust import HEARTBEAT_GRACE_KEY
from celeryapp.recovery.recovery import recover
from tests import processes
from tests.fault_tasks import read_log
from tests.helpers import call, db_execution
from tests.sentinel import SentinelCluster
from tests.servers import wait_for

MASTER = "chordbeat-primary"
#: The step's lease (7.25 s, refreshed every 2.4 s) outlives a ``SENTINEL FAILOVER`` (1.3 s) with
#: its worker held still.
TTL_S = 8.0
#: The healthy step outlives: a TTL before the failover (so that recovery looks at its
#: heartbeat), the failover, the grace of one TTL, and a few passes after it.
HEALTHY_S = 2 * TTL_S + 12
#: Still running when its worker is killed; its second attempt is only seen starting.
DOOMED_S = 60.0
DOOMED_QUEUE = "doomed"
#: The default's order of magnitude (the passes are the test's): a pass that finds no trace of the
#: last one within two intervals and a TTL gives heartbeats a grace anyway (heartbeats_trusted).
RECOVERY_INTERVAL_S = 30.0


@pytest.fixture
def cluster(shift_s: int) -> Iterator[SentinelCluster]:
    servers = SentinelCluster(master=MASTER, replica_clock_shift_s=shift_s)
    servers.start()
    yield servers
    servers.close()


def tick(log: Path, seconds: float, **extra: Any) -> dict[str, Any]:
    return {"name": "long", "task": "faults.tick", "kwargs": {"log": str(log), "seconds": seconds}, **extra}


def starts(log: Path, execution_id: int) -> list[int]:
    """The attempts whose body began, in order (one entry per run of the step's code)."""
    return [e["attempt"] for e in read_log(str(log)) if e["event"] == "start" and e["execution_id"] == execution_id]


def started_again(log: Path, execution_id: int) -> bool:
    return 2 in starts(log, execution_id)


def reaches(client: redis.Redis, run_id: str) -> bool:
    return client.info("server")["run_id"] == run_id


def recovering_until(app: ChordbeatCelery, condition: Any, timeout: float, what: str) -> None:
    """Recovery passes, as the periodic task runs them, until ``condition`` holds.

    Each pass is given the true time: the failover also moves the reference clock (Redis ``TIME``)
    by the shift, which issue 35's item 3 deals with elsewhere; what is tested here is only how
    heartbeats expire."""

    def one_pass() -> object:
        recover(app, now=datetime.now(UTC))
        return condition()

    wait_for(one_pass, timeout, interval=0.3, what=what)


# +20 s is the case (shorter than any refresh gap of a default TTL: only some keys fall);
# 60 s, ahead and behind, the larger steps. 20 s behind is left out: it is the 60 s case with less
# time for a dead worker's heartbeat to outlive (each case starts a Sentinel group and 3 workers).
@pytest.mark.slow
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("shift_s", [20, 60, -60])
@pytest.mark.timeout(300)
def test_a_failover_to_a_replica_with_another_clock_reruns_no_healthy_step_and_loses_no_dead_one(
    cluster: SentinelCluster, app: ChordbeatCelery, settings: Settings, tmp_path: Path, shift_s: int
) -> None:
    """Before: ahead, the first pass after the failover took the healthy step for lost and ran it
    again as attempt 2; behind, the killed worker's step waited about 60 s more for its heartbeat
    to expire."""
    sentinels = replace(
        settings,
        broker_url=cluster.url,
        result_backend=cluster.url,
        redbeat_url=cluster.url,
        sentinel_master=MASTER,
        heartbeat_ttl_s=TTL_S,
        recovery_interval_s=RECOVERY_INTERVAL_S,
    )
    reset_clients()
    app.apply_settings(sentinels)
    log = tmp_path / "steps.log"
    env = processes.FAULT_TASKS_ENV
    client = ChordbeatClient(sentinels.broker_url, sentinels.result_backend, sentinel_master=MASTER)
    with (
        processes.worker(sentinels, tmp_path, "w1", env=env) as w1,
        processes.step_worker(sentinels, tmp_path, "w2", concurrency=1, queues=DOOMED_QUEUE, env=env) as w2,
    ):
        healthy_run = {"name": "healthy", "every": 3600, "steps": [tick(log, HEALTHY_S)]}
        doomed_run = {"name": "doomed", "every": 3600, "steps": [tick(log, DOOMED_S, queue=DOOMED_QUEUE)]}
        call(client.app, "chordbeat.apply_schedule", definition=healthy_run)
        call(client.app, "chordbeat.apply_schedule", definition=doomed_run)
        healthy = call(client.app, "chordbeat.trigger_schedule", name="healthy")["execution_id"]
        doomed = call(client.app, "chordbeat.trigger_schedule", name="doomed")["execution_id"]
        wait_for(lambda: starts(log, healthy) and starts(log, doomed), 30, what="both steps to start")
        # Passes before the failover: past their first grace, with both steps older than a TTL
        # (recovery then reads their heartbeats), and all of it replicated.
        old = cluster.primary()
        (replica,) = set(cluster.servers) - {old}
        recovering_until(
            app,
            lambda: (
                not cluster.client(old).exists(HEARTBEAT_GRACE_KEY)
                and (datetime.now(UTC) - db_started(app, healthy)).total_seconds() > TTL_S + 1
            ),
            30,
            "the first grace to end and the steps to be older than a TTL",
        )
        written = cluster.client(old).info("replication")["master_repl_offset"]
        wait_for(
            lambda: cluster.client(replica).info("replication")["slave_repl_offset"] >= written,
            10,
            what="the replica to catch up",
        )
        # The first pass on the new primary comes before w1's next refresh reaches it. With the
        # default TTL (15 s) a refresh is up to 4.75 s away, a window a periodic pass falls into by
        # chance; here w1 is held still (shorter than its lease) so that the pass is in it.
        w1.signal_group(signal.SIGSTOP)
        fault = time.time()
        try:
            cluster.force_failover()
            assert cluster.wait_promoted(old) == replica
            cluster.demote_now(old)
            w2.kill()  # a worker really lost during the grace
            promoted = cluster.client(replica).info("server")["run_id"]
            recovery_redis = get_redis(sentinels.broker_url)
            wait_for(partial(reaches, recovery_redis, promoted), 10, what="recovery to reach the new primary")
            first = recover(app, now=datetime.now(UTC))
        finally:
            w1.signal_group(signal.SIGCONT)
        assert first.requeued == [], f"healthy steps taken for lost: {first}"
        with processes.step_worker(sentinels, tmp_path, "w3", concurrency=1, queues=DOOMED_QUEUE, env=env) as w3:
            try:
                # Past the grace, not a shift later.
                rerun = partial(started_again, log, doomed)
                recovering_until(app, rerun, 3 * TTL_S, "the dead worker's step to run again")
                recovering_until(
                    app,
                    lambda: db_execution(app, healthy)["status"] != "in_progress",
                    HEALTHY_S,
                    "the healthy run to end",
                )
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n--- w1 ---\n{w1.output()[-4000:]}") from exc
            finally:
                w3.kill()  # its step runs for a minute: no warm shutdown
        done = db_execution(app, healthy)
    assert starts(log, healthy) == [1], w1.output()[-4000:]
    assert [(a["step"], a["status"], a["attempt"]) for a in done["activities"]] == [("long", "complete", 1)]
    assert done["status"] == "completed"
    assert starts(log, doomed) == [1, 2]
    again = next(e["t"] for e in read_log(str(log)) if e["event"] == "start" and e["attempt"] == 2)
    print(f"\nfailover to a replica {shift_s:+d}s off: the dead worker's step ran again {again - fault:.1f}s after it")


def db_started(app: ChordbeatCelery, execution_id: int) -> datetime:
    started = db_execution(app, execution_id)["started_at"]
    return datetime.fromisoformat(started.replace("Z", "+00:00"))
