"""Hosts cut off from Redis (tests/support/lab.py: network namespaces on a bridge, nftables drops).

Lease discipline: a worker whose step's heartbeat no longer reaches Redis stops the step itself
before the heartbeat can expire, so that when recovery (on another host) re-queues the attempt
and a worker there runs it, the two never run at once.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.domain.names import STEPS_QUEUE
from celeryapp.interfaces import service
from tests.support import processes
from tests.support.fault_tasks import read_log
from tests.support.helpers import db_execution, step, ts, wait_for
from tests.support.lab import Host, Lab, LabServers, lab, lab_servers, lab_settings  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

#: Long enough that, run on, the cut-off attempt would still be running when the next one starts.
STEP_S = 10.0


@pytest.fixture
def settings(lab_settings: Settings) -> Settings:  # noqa: F811  (conftest's app and client use the lab's)
    return lab_settings


def tick(log: Path, seconds: float) -> dict[str, Any]:
    return {"name": "long", "task": "faults.tick", "kwargs": {"log": str(log), "seconds": seconds}}


def _cut(lab: Lab, host: Host, how: str) -> None:  # noqa: F811
    if how == "unplugged":
        lab.unplug(host)
    else:
        lab.cut(host, how)


#: Run inside a host: connect to Redis, say so, then on each line read write that key and say how
#: it went. The connection is made before the cut: one way, its writes may land unanswered.
_WRITER = """
import sys, redis
client = redis.Redis(host=sys.argv[1], port=int(sys.argv[2]), socket_timeout=2, socket_connect_timeout=2, retry=None)
client.ping()
print("ready", flush=True)
for line in sys.stdin:
    try:
        print("written" if client.set(line.strip(), "1") else "refused", flush=True)
    except redis.RedisError as exc:
        print(type(exc).__name__, flush=True)
"""


def test_the_lab_cuts_each_direction_and_heals(lab: Lab, lab_servers: LabServers) -> None:  # noqa: F811
    """The lab's own faults do what they say: with a host's inbound traffic dropped its write
    still lands (only the answer is lost); with its outbound traffic dropped, or both ways, or its
    cable pulled, it does not; healed, it writes again."""
    host = lab.add_host("h")
    redis_root = redis.Redis.from_url(lab_servers.redis_url)
    for how, lands in (("inbound", True), ("outbound", False), ("both", False), ("unplugged", False)):
        argv = ["ip", "netns", "exec", host.namespace, sys.executable, "-c", _WRITER]
        writer = subprocess.Popen(
            [*argv, lab.server_address, str(lab_servers.redis.port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert writer.stdin is not None and writer.stdout is not None
        try:
            assert writer.stdout.readline().strip() == "ready"
            _cut(lab, host, how)
            writer.stdin.write(f"{how}\n")
            writer.stdin.flush()
            assert writer.stdout.readline().strip() == "TimeoutError", f"{how}: the host still got an answer"
            assert bool(redis_root.exists(how)) is lands, how
            lab.heal(host)
            writer.stdin.write(f"{how}-healed\n")
            writer.stdin.flush()
            assert writer.stdout.readline().strip() == "written", f"{how}: not healed"
        finally:
            writer.kill()
            writer.wait(5)


@pytest.mark.parametrize("how", ["both", "inbound", "outbound", "unplugged"])
def test_a_host_cut_off_from_redis_stops_its_step_before_another_host_runs_it(
    app: ChordbeatCelery,
    settings: Settings,
    lab: Lab,  # noqa: F811
    tmp_path: Path,
    how: str,
) -> None:
    """Before: the cut-off worker could not see recovery's fence and ran its step to the end,
    while another host ran the re-queued attempt: the same step twice at once."""
    log = tmp_path / "steps.log"
    env = processes.FAULT_TASKS_ENV
    a, b = lab.add_host("a"), lab.add_host("b")
    # Host a runs steps only, one at a time: the first attempt is its.
    a.worker(settings, tmp_path, "wa", concurrency=1, queues=STEPS_QUEUE, env=env)
    service.apply_schedule(app, {"name": "cut", "every": 3600, "steps": [tick(log, STEP_S), step("after")]})
    execution_id = service.trigger_schedule(app, "cut")["execution_id"]
    wait_for(lambda: any(e["event"] == "tick" for e in read_log(str(log))), 60, what="the step to run on host a")
    # Host b: beat (so recovery runs), and a worker of every queue (recovery, the next attempt).
    b.worker(settings, tmp_path, "wb", concurrency=2, env=env)
    b.beat(settings, tmp_path)
    _cut(lab, a, how)
    try:
        # Attempt 2 at work for a second: run on, attempt 1 would be ticking beside it meanwhile.
        wait_for(
            lambda: sum(e["attempt"] == 2 and e["event"] == "tick" for e in read_log(str(log))) >= 10,
            60,
            interval=0.1,
            what="recovery to run attempt 2 on host b",
        )
    finally:
        lab.heal(a)
    done = wait_for(
        lambda: (e := db_execution(app, execution_id))["status"] != "in_progress" and e,
        60,
        interval=0.2,
        what="the run to end",
    )
    assert isinstance(done, dict)
    events = read_log(str(log))
    one = [e for e in events if e["attempt"] == 1]
    two = [e for e in events if e["attempt"] == 2]
    assert not any(e["event"] == "end" for e in one), "the cut-off attempt ran to its end"
    assert any(e["event"] == "interrupted" for e in one), "the cut-off attempt was not stopped"
    overlap = max(e["t"] for e in one) - min(e["t"] for e in two)
    assert overlap < 0, f"attempts 1 and 2 ran at once for {overlap:.2f}s"
    assert done["status"] == "completed", done
    steps = [(x["step"], x["attempt"], x["status"]) for x in done["activities"]]
    assert steps == [("long", 1, "failed_with_error"), ("long", 2, "complete"), ("after", 1, "complete")], steps
    first, second = done["activities"][:2]
    assert first["error"].startswith("worker lost"), first
    # The database agrees: attempt 2 was claimed after attempt 1's last sign of life.
    assert ts(second["started_at"]).timestamp() > max(e["t"] for e in one)
    print(f"\n{how}: attempt 1 stopped {-overlap:.2f}s before attempt 2 started")
