"""Redis goes away for a while, the way it does in production: workers and beat ride it out.

A graceful restart (SIGTERM, as ``systemctl restart`` does) with an outage of several seconds,
a SIGKILL, and a frozen server (SIGSTOP: sockets open, no answers). Afterwards the same worker and
beat processes must still be running, answer the service tasks, finish the run that was in flight
and go on firing.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import signal
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis
from celery import Celery

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.interfaces import service
from tests.support import processes
from tests.support.helpers import call, db_execution, rode_out, running, step, ts, wait_for
from tests.support.servers import RedisServer

pytestmark = [pytest.mark.slow, pytest.mark.both_databases]

#: Long enough that a worker's first reconnection attempts fail, as in a real restart;
#: ``CHORDBEAT_TEST_OUTAGE_S=60`` checks the longest outage docs/reliability.md promises to ride out.
OUTAGE_S = float(os.environ.get("CHORDBEAT_TEST_OUTAGE_S", "6"))


@pytest.mark.parametrize(
    ("how", "keep_data"),
    [("graceful", False), ("graceful", True), ("kill", False), ("freeze", True)],
    ids=["graceful-restart-empty", "graceful-restart-with-data", "sigkill", "frozen"],
)
@pytest.mark.timeout(120)
def test_worker_and_beat_ride_out_a_redis_outage(
    app: ChordbeatCelery,
    client: Celery,
    settings: Settings,
    tmp_path: Path,
    redis_server: RedisServer,
    how: str,
    keep_data: bool,
) -> None:
    # A beat that hangs ends itself after this with every thread's stack in its log (seen once in
    # CI: silent from the outage on); nothing restarts it here, so the test fails with the stacks.
    # Above Redis's socket timeout (30 s): a call waiting that long is slow, not stuck.
    beat_settings = dataclasses.replace(settings, beat_stall_s=60)
    with processes.worker(settings, tmp_path, "w1") as worker, processes.beat(beat_settings, tmp_path) as beat:
        call(
            client,
            "chordbeat.apply_schedule",
            definition={
                "name": "through",
                "every": 3600,
                "steps": [step("before"), step("long", kwargs={"seconds": 5}), step("after")],
            },
        )
        call(client, "chordbeat.apply_schedule", definition={"name": "ticker", "every": 1, "steps": [step("t")]})
        execution_id = call(client, "chordbeat.trigger_schedule", name="through")["execution_id"]
        running(client, execution_id, "long")
        redis_server.outage(OUTAGE_S, how=how, keep_data=keep_data)
        back = datetime.now(UTC)
        try:
            # Beat fires again, and its runs complete.
            done, fresh = rode_out(app, execution_id, "ticker", back, "outage")
        except AssertionError as exc:
            # Beat's log is mostly its firing lines: its last ones, and the worker's complaints and
            # the run's rows, which say where a run stuck after the outage stands.
            worker_log = "\n".join(line for line in worker.output().splitlines() if " INFO/" not in line)
            raise AssertionError(
                f"{exc}\n--- the run ---\n{db_execution(app, execution_id)}"
                f"\n--- the worker's log but its INFO lines ---\n{worker_log[-6000:]}"
                f"\n--- beat's log (with its stacks if it stalled) ---\n{beat.output()[-4000:]}"
            ) from exc
        # The same worker answers the service tasks.
        assert call(client, "chordbeat.get_execution", execution_id=execution_id)["status"] == "completed"
        assert worker.proc.poll() is None, f"worker exited:\n{worker.output()[-3000:]}"
        assert beat.proc.poll() is None, f"beat exited:\n{beat.output()[-3000:]}"
        assert "Unrecoverable error" not in worker.output()
    assert done["status"] == "completed", done
    per_step: dict[str, list[str]] = {}
    for activity in done["activities"]:
        per_step.setdefault(activity["step"], []).append(activity["status"])
    # What had finished before the outage ran exactly once; nothing was left in progress.
    assert per_step["before"] == ["complete"]
    assert per_step["after"] == ["complete"]
    # The step running through the outage outlasted its lease (the heartbeat's TTL less 0.75 s,
    # docs/reliability.md): its worker, which cannot tell an outage from being cut off, stopped it
    # before recovery could run it elsewhere, and it ran again once Redis was back, to its end.
    assert per_step["long"] == ["failed_with_error", "complete"]
    first_step = min(ts(a["started_at"]) for e in fresh for a in e["activities"])
    print(
        f"\nRedis back ({how}, data {'kept' if keep_data else 'lost'}) to a fired step running: "
        f"{(first_step - back).total_seconds():.1f}s"
    )


def test_a_beat_stuck_in_a_call_ends_itself_with_every_stack_on_stderr(
    settings: Settings, tmp_path: Path, redis_server: RedisServer
) -> None:
    """Beat blocked in a Redis call that does not return (a frozen server: sockets open, no
    answers) stops every schedule, and only an exit gets it restarted by systemd, Compose or
    ``make run``. Before its watchdog it sat there until its socket timed out (30 s)."""
    # The beat an earlier test left stalled (this test's other database) never released RedBeat's
    # lock: it would hold this beat off for up to its 30 s.
    redis.Redis.from_url(redis_server.url).flushall()
    stalling = dataclasses.replace(settings, beat_stall_s=5)
    with processes.beat(stalling, tmp_path) as beat:
        wait_for(lambda: "acquired lock" in beat.output(), 30, what="beat to take the lock")
        assert redis_server.proc is not None
        redis_server.proc.send_signal(signal.SIGSTOP)
        try:
            wait_for(lambda: not beat.running, 20, interval=0.2, what="the stalled beat to end itself")
        finally:
            redis_server.proc.send_signal(signal.SIGCONT)
    assert beat.proc.returncode == 1
    dump = beat.output()
    assert "Timeout (0:00:05)!" in dump
    # Where it hung: the main thread's stack, down to the socket read.
    main_thread_in_redis = r"Thread 0x[0-9a-f]+ \(most recent call first\):\n(  File .*\n)*  File .*redis/"
    assert re.search(main_thread_in_redis, dump), dump[-3000:]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_beat_started_while_redis_is_away_waits_for_it_then_fires(
    app: ChordbeatCelery, settings: Settings, tmp_path: Path
) -> None:
    """Beat exited at once ("beat raised exception ConnectionError") where a worker waits."""
    service.apply_schedule(app, {"name": "waited", "every": 1, "steps": [step("s")]})
    away = RedisServer()  # not started: its port refuses connections
    redis_away = dataclasses.replace(settings, broker_url=away.url, result_backend=away.url, redbeat_url=away.url)
    liveness = Path(settings.health_dir) / "chordbeat-beat.health"

    def written_at() -> int:
        return liveness.stat().st_mtime_ns if liveness.exists() else 0

    try:
        with processes.beat(redis_away, tmp_path) as beat:
            wait_for(
                lambda: "waiting for Redis to start" in beat.output() or not beat.running,
                30,
                interval=0.2,
                what="beat to wait for Redis",
            )
            assert beat.running, beat.output()[-3000:]
            # It goes on trying (each try writes its liveness file), still alive.
            for _ in range(3):
                wait_for(functools.partial(lambda last: written_at() > last, written_at()), 20, what="another try")
            assert beat.running, beat.output()[-3000:]
            away.start()
            with processes.worker(redis_away, tmp_path, "w1"):
                wait_for(
                    lambda: service.list_executions(app, "waited"), 60, interval=0.3, what="a fire once Redis is up"
                )
            assert "Redis answered after" in beat.output()
    finally:
        away.close()
