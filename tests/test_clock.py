"""One clock for every process: hosts whose clocks disagree (libfaketime) fire, time out, recover
and record runs as if they agreed."""

from __future__ import annotations

import html
import json
import logging
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import select

from celeryapp.application import ChordbeatCelery
from celeryapp.clock import MAX_ROUND_TRIP_S, ReferenceClock, clock
from celeryapp.config import Settings
from celeryapp.domain.names import CONTROL_QUEUE, PUBLIC_QUEUE
from celeryapp.interfaces import service
from celeryapp.messaging import reference_time
from celeryapp.messaging.redis_client import get_redis
from celeryapp.monitoring.metrics import ExecutionCollector
from celeryapp.recovery.heartbeat_trust import RECOVERY_SEEN_KEY
from models import SlotOutcome, SlotRecord, transaction
from tests.support import processes
from tests.support.helpers import call, executions, finished, running, step, ts, wait_for
from tests.support.web_server import ADMIN, WebServer, text_of

# --- the clock itself -------------------------------------------------------------------------


def test_without_a_reference_the_clock_is_the_hosts() -> None:
    clock = ReferenceClock()
    assert abs(clock.timestamp() - time.time()) < 0.05
    assert clock.reading is None


def test_reference_time_moves_on_by_the_monotonic_clock_between_readings() -> None:
    reads: list[float] = []

    def reference() -> float:
        reads.append(time.time() - 90)
        return reads[-1]

    clock = ReferenceClock()
    clock.use(reference)
    first = clock.timestamp()
    assert abs(first - (time.time() - 90)) < 0.05
    assert clock.reading is not None and abs(clock.reading.offset_s - 90) < 0.05
    second = clock.timestamp()
    assert len(reads) == 1, "read once, then kept by the monotonic clock"
    assert second >= first


def test_a_failed_reading_keeps_the_last_one_and_is_not_retried_at_once() -> None:
    answers: list[float | Exception] = [1_000.0, ConnectionError("Redis away")]

    def reference() -> float:
        answer = answers.pop(0) if answers else 2_000.0
        if isinstance(answer, Exception):
            raise answer
        return answer

    clock = ReferenceClock()
    clock.use(reference)
    assert abs(clock.timestamp() - 1_000) < 0.05
    assert clock.measure() is not None and answers == []  # the failure: the last reading kept
    assert abs(clock.timestamp() - 1_000) < 0.05, "not read again at once after a failure"


def test_a_slow_reading_serves_as_the_first_but_does_not_replace_a_good_one() -> None:
    """A loaded host's first reading may be slow; the host's own clock may be minutes off."""
    answers = [time.time() + 300, time.time() + 300, time.time() + 300, 0.0]
    slow = [True, True, True, False]

    def reference() -> float:
        if slow.pop(0):
            time.sleep(MAX_ROUND_TRIP_S * 1.2)
        return answers.pop(0)

    clock = ReferenceClock()
    clock.use(reference)
    assert clock.measure() is not None
    assert abs(clock.timestamp() - (time.time() + 300)) < 1, "the slow first reading, not the host's clock"
    slow[:] = [True, True, True]
    answers[:] = [1.0, 1.0, 1.0]
    assert clock.measure() is not None
    assert abs(clock.timestamp() - (time.time() + 300)) < 1, "three slow readings do not replace a good one"


def test_a_caller_waits_for_the_first_reading_another_thread_is_taking() -> None:
    """A worker's first message arrived while its start-up recovery took the first reading: the
    message's expiry was judged by the host's clock (35 s ahead) and the message discarded."""
    reading_started, may_answer = threading.Event(), threading.Event()

    def reference() -> float:
        reading_started.set()
        may_answer.wait(10)
        return time.time() + 1_000

    clock = ReferenceClock()
    clock.use(reference)
    first = threading.Thread(target=clock.measure)
    first.start()
    try:
        assert reading_started.wait(10)
        threading.Timer(0.2, may_answer.set).start()
        now = clock.timestamp()
    finally:
        may_answer.set()
        first.join(10)
    assert abs(now - (time.time() + 1_000)) < 1, "the host's clock stood in for the reference"


def test_every_process_notes_its_offset_and_a_gone_one_is_dropped(app: ChordbeatCelery) -> None:
    client = get_redis(app.settings.broker_url)
    reference_time.install(app.settings.broker_url)
    now_s = reference_time.read_reference(app.settings.broker_url)
    assert clock.measure() is not None
    client.hset(reference_time.OFFSETS_KEY, "gone-host pid 1", '{"offset_s": 40, "at": 1}')
    client.hset(reference_time.OFFSETS_KEY, "garbled", "{")
    found = reference_time.offsets(client, now_s)
    assert [o.process for o in found] == [reference_time.process_name()]
    assert abs(found[0].offset_s) < 1
    assert not client.hexists(reference_time.OFFSETS_KEY, "gone-host pid 1")


# --- processes whose clocks disagree ----------------------------------------------------------


def redis_now(url: str) -> float:
    seconds, microseconds = get_redis(url).time()
    return float(seconds) + microseconds / 1_000_000


def _slots(app: ChordbeatCelery) -> list[SlotRecord]:
    with transaction(app.settings.database_url) as session:
        return list(session.scalars(select(SlotRecord).order_by(SlotRecord.id)))


@pytest.mark.parametrize("beat_offset_s", [-90, 25, 90])
def test_a_beat_whose_clock_is_off_fires_every_slot_on_time(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings, tmp_path: Path, beat_offset_s: int
) -> None:
    """Beat 25 s ahead with slots 20 s apart had every slot recorded superseded; more than 60 s
    ahead, every fire was refused; behind, slots fired late."""
    call(client, "chordbeat.apply_schedule", definition={"name": "tick", "every": 2, "steps": [step("s")]})
    with processes.beat(settings, tmp_path, env=processes.skewed(beat_offset_s)) as beat:
        wait_for(lambda: len(executions(app)) >= 3, 30, interval=0.2, what=f"three runs; beat said:\n{beat.output()}")
    reference_now = redis_now(settings.broker_url)
    slots = _slots(app)
    assert {s.outcome for s in slots} == {SlotOutcome.FIRED}, [(s.outcome, s.nominal_at) for s in slots]
    for slot in slots:
        assert slot.nominal_at is not None
        # Reckoned by the reference clock: none in its future, none long past.
        assert reference_now - 20 < slot.nominal_at.timestamp() <= reference_now + 0.5, slot.nominal_at


def test_recovery_messages_reach_a_worker_whose_clock_is_ahead(
    app: ChordbeatCelery, settings: Settings, tmp_path: Path
) -> None:
    """Celery compares a message's expiry with the receiving host's clock: a worker 35 s ahead
    discarded every recovery message beat sent (their expiry is one recovery interval)."""
    redis_client = get_redis(settings.broker_url)
    with (
        processes.control_worker(settings, tmp_path, queues=CONTROL_QUEUE, env=processes.skewed(35)) as control,
        processes.beat(settings, tmp_path),
    ):
        wait_for(lambda: redis_client.exists(RECOVERY_SEEN_KEY), 30, what=f"a recovery pass:\n{control.output()}")
    assert "Discarding revoked task: chordbeat.recover" not in control.output()


@pytest.mark.timeout(120)
def test_hosts_whose_clocks_disagree_record_a_consistent_timeline_and_keep_deadlines(
    app: ChordbeatCelery, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    """Three hosts: service calls on a true clock, steps 60 s behind, control (advancement and
    recovery) 35 s ahead. The run's 20 s deadline, set by one host and checked by another, holds
    (recovery 35 s ahead failed it at once), and no time recorded comes before the run's start."""
    definition = {
        "name": "skewed",
        "every": 3600,
        "timeout": 20,
        "steps": [step("a", kwargs={"seconds": 4}), step("b", kwargs={"seconds": 0.1})],
    }
    with (
        processes.control_worker(settings, tmp_path, "service", queues=PUBLIC_QUEUE),
        processes.step_worker(settings, tmp_path, env=processes.skewed(-60)),
        processes.control_worker(settings, tmp_path, queues=CONTROL_QUEUE, env=processes.skewed(35)),
    ):
        call(client, "chordbeat.apply_schedule", definition=definition)
        execution_id = call(client, "chordbeat.trigger_schedule", name="skewed")["execution_id"]

        def recovered_while_running() -> bool:
            client.send_task("chordbeat.recover", queue=CONTROL_QUEUE, ignore_result=True)
            return call(client, "chordbeat.get_execution", execution_id=execution_id)["status"] != "in_progress"

        wait_for(recovered_while_running, 30, interval=0.5, what="the run to end")
        done = finished(client, execution_id)
    assert done["status"] == "completed", done
    started = ts(done["started_at"])
    assert ts(done["completed_at"]) >= started
    for activity in done["activities"]:
        assert ts(activity["started_at"]) >= started - timedelta(seconds=1), activity
        assert ts(activity["completed_at"]) >= ts(activity["started_at"]), activity
    assert abs(started.timestamp() - redis_now(settings.broker_url)) < 30


def test_a_host_whose_clock_is_off_is_warned_about_shown_and_measured(
    app: ChordbeatCelery, settings: Settings, tmp_path: Path
) -> None:
    """Its log warns, the dashboard's health page names it and the metrics give its offset."""
    redis_client = get_redis(settings.broker_url)
    with processes.step_worker(settings, tmp_path, "ahead", env=processes.skewed(40)) as ahead:
        wait_for(lambda: "clock is" in ahead.output(), 20, what="the skewed worker's warning")
        assert "40.0 s ahead of Redis's" in ahead.output(), ahead.output()
        wait_for(lambda: redis_client.hlen(reference_time.OFFSETS_KEY), 10, what="its offset noted")
        with WebServer(app) as web:
            health = html.unescape(text_of(web.session(ADMIN).get(web.url + "/health", timeout=10).text))
        assert "its host's clock is 40" in health and "ahead of Redis's" in health, health
        offsets = {
            sample.labels["process"]: sample.value
            for family in ExecutionCollector(app).collect()
            if family.name == "chordbeat_clock_offset_seconds"
            for sample in family.samples
        }
        assert any(39 < offset < 41 for offset in offsets.values()), offsets


@pytest.mark.timeout(120)
def test_a_dead_worker_whose_clock_was_ahead_has_its_step_recovered_without_waiting_out_the_skew(
    app: ChordbeatCelery, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    """The step's start was written by its worker's clock, 35 s ahead, and recovery waited for
    that start to be a heartbeat's TTL old: 35 s more before the dead worker's step ran again."""
    definition = {"name": "ahead", "every": 3600, "steps": [step("long", kwargs={"seconds": 3})]}
    with (
        processes.control_worker(settings, tmp_path),
        processes.step_worker(settings, tmp_path, "doomed", env=processes.skewed(35)) as doomed,
        processes.beat(settings, tmp_path),
    ):
        call(client, "chordbeat.apply_schedule", definition=definition)
        execution_id = call(client, "chordbeat.trigger_schedule", name="ahead")["execution_id"]
        running(client, execution_id, "long")
        doomed.kill()
        with processes.step_worker(settings, tmp_path, "replacement"):
            # TTL 3 s and a pass every second: the step runs again within a few seconds.
            done = finished(client, execution_id, timeout=25)
    assert done["status"] == "completed", done
    first, second = done["activities"]
    assert first["error"].startswith("worker lost"), first
    assert second["attempt"] == 2 and second["worker"].startswith("replacement@"), second


def test_a_reading_due_is_taken_without_making_the_caller_wait() -> None:
    """A caller may hold a transaction (SQLite's write lock): a Redis that stalls must not hold it."""
    release = threading.Event()
    calls: list[float] = []

    def reference() -> float:
        calls.append(time.monotonic())
        if len(calls) > 1:
            release.wait(10)  # a stalled Redis
        return time.time() + 50

    clock = ReferenceClock()
    clock.use(reference)
    clock.timestamp()
    clock._next_try_s = float("-inf")  # the interval has passed
    asked = time.monotonic()
    first = clock.timestamp()
    assert time.monotonic() - asked < 0.1, "the caller did not wait for the stalled reading"
    assert abs(first - (time.time() + 50)) < 0.05, "the last reading serves meanwhile"
    wait_for(lambda: len(calls) == 2, 5, what="the background reading")
    clock.timestamp()
    assert len(calls) == 2, "one background reading at a time"
    release.set()


@pytest.mark.timeout(120)
def test_the_broker_notes_when_a_worker_whose_clock_is_ahead_took_a_message_by_the_reference(
    app: ChordbeatCelery, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    """kombu timed its unacknowledged messages by the host's clock; recovery compares that time with
    its own: a dead worker 60 s ahead had its message sent again 60 s late."""
    definition = {"name": "held", "every": 3600, "steps": [step("long", kwargs={"seconds": 4})]}
    redis_client = get_redis(settings.broker_url)
    with (
        processes.control_worker(settings, tmp_path),
        processes.step_worker(settings, tmp_path, "ahead", env=processes.skewed(60)),
    ):
        call(client, "chordbeat.apply_schedule", definition=definition)
        execution_id = call(client, "chordbeat.trigger_schedule", name="held")["execution_id"]
        running(client, execution_id, "long")
        taken = wait_for(lambda: redis_client.zrange("unacked_index", 0, -1, withscores=True), 10, what="unacked")
        reference_now = redis_now(settings.broker_url)
        assert isinstance(taken, list)
        assert all(abs(score - reference_now) < 10 for _tag, score in taken), (taken, reference_now)
        finished(client, execution_id)


_CALLER = """
import json, sys
from celeryapp.client import ChordbeatClient
client = ChordbeatClient(sys.argv[1], sys.argv[1], timeout_s=10)
print(json.dumps(client.call("chordbeat.trigger_schedule", name="called")))
"""


@pytest.mark.parametrize("caller_offset_s", [-120, 120])
def test_a_service_whose_clock_is_off_can_still_call(
    app: ChordbeatCelery, worker: Any, settings: Settings, caller_offset_s: int
) -> None:
    """ChordbeatClient's calls expire with its timeout; written by its host's clock 2 minutes
    behind, every call had expired before a worker saw it (2 minutes ahead: a call the caller gave
    up on would still run up to 2 minutes later: not observable here, but the same expiry)."""
    service.apply_schedule(app, {"name": "called", "every": 3600, "steps": [step("s")]})
    env = {**processes.settings_env(settings), **processes.skewed(caller_offset_s), "PYTHONPATH": processes.ROOT}
    done = subprocess.run(
        [sys.executable, "-c", _CALLER, settings.broker_url], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1])["execution_id"] is not None


def test_a_reference_away_is_logged_once_and_its_return_once(caplog: pytest.LogCaptureFixture) -> None:
    """A Redis outage must not add a warning every 5 s to every process's log."""
    away = True

    def reference() -> float:
        if away:
            raise ConnectionError("Redis away")
        return time.time()

    clock = ReferenceClock()
    clock.use(reference)
    with caplog.at_level(logging.DEBUG, logger="celeryapp.clock"):
        for _ in range(4):
            clock.measure()
        away = False
        clock.measure()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert any("read again" in r.getMessage() for r in caplog.records)
