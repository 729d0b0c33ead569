"""The watch beside a running step: what it sees after its process or Redis was frozen."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import redis

from celeryapp.errors import StepCancelled
from celeryapp.worker import heartbeat
from celeryapp.worker.heartbeat import CANCEL_POLL_S, StepWatch
from tests.support.servers import RedisServer, wait_for


def _exists_calls(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_exists", {}).get("calls", 0))


def test_a_flag_check_that_outlasted_a_poll_is_made_again_at_once() -> None:
    """A check of the cancel and fence flags that took longer than a poll may answer from before a
    freeze (a SIGSTOP or VM pause of the worker, a stalled Redis): recovery may have fenced the
    attempt meanwhile. The watch checks again at once instead of a poll later (the chaos test saw a
    fenced step run on for a poll after its worker woke)."""
    server = RedisServer()
    server.start()
    try:
        assert server.proc is not None
        client = redis.Redis.from_url(server.url)
        # One EXISTS a check (no fence or stop key); the heartbeat is refreshed every 10 s only.
        watch = StepWatch(redis.Redis.from_url(server.url), heartbeat_key="hb", cancel_key="cancel", ttl_s=30)
        with watch:
            wait_for(lambda: _exists_calls(client) >= 1, 5, interval=0.05, what="the watch's first flag check")
            before = _exists_calls(client)
            os.kill(server.proc.pid, signal.SIGSTOP)
            try:
                time.sleep(2 * CANCEL_POLL_S + 0.2)  # the outage's length, not a synchronisation
            finally:
                os.kill(server.proc.pid, signal.SIGCONT)
            resumed = time.monotonic()
            # The check made during the outage, answered now, and the one made at once after it.
            wait_for(lambda: _exists_calls(client) >= before + 2, 2, interval=0.02, what="a second flag check")
            assert time.monotonic() - resumed < CANCEL_POLL_S * 0.7, "the second flag check waited for the next poll"
        assert not (watch.cancelled or watch.fenced or watch.timed_out)
    finally:
        server.close()


def _run_until_interrupted(watch: StepWatch, seconds: float) -> bool:
    """A step at work under ``watch`` (made in this thread: the one it interrupts) for up to
    ``seconds``; whether the watch interrupted it."""
    try:
        with watch:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                time.sleep(0.01)  # a step at work
    except StepCancelled:
        return True
    return False


def _watch_threads(besides: frozenset[threading.Thread] = frozenset()) -> list[threading.Thread]:
    """Watching threads, but those in ``besides`` (other tests' steps in this process)."""
    return [t for t in threading.enumerate() if t.name == "chordbeat-step-watch" and t not in besides]


def test_steps_of_a_process_share_one_watching_thread_which_ends_when_idle() -> None:
    """A thread per step cost each step its start and end (and a round trip to delete its keys):
    one thread watches every step of the process, deletes finished steps' keys at its next poll,
    and ends once it has nothing left to do."""
    server = RedisServer()
    server.start()
    try:
        client = redis.Redis.from_url(server.url)
        others = frozenset(_watch_threads())
        watches = [
            StepWatch(client, heartbeat_key=f"hb:{n}", cancel_key="cancel", ttl_s=30, done_keys=(f"pickup:{n}",))
            for n in range(5)
        ]
        for n, watch in enumerate(watches):
            client.set(f"pickup:{n}", "1")
            watch.__enter__()
        assert len(_watch_threads(others)) == 1
        assert client.exists(*(f"hb:{n}" for n in range(5))) == 5
        client.set("cancel", "1")  # every watched step is interrupted; here, none is armed any more
        for watch in watches:
            watch.disarm()
        wait_for(lambda: all(w.cancelled is False for w in watches) and _exists_calls(client) >= 5, 5, what="a check")
        for watch in watches:
            watch.__exit__(None, None, None)
        wait_for(lambda: not client.keys("hb:*") and not client.keys("pickup:*"), 5, interval=0.05, what="keys deleted")
        wait_for(lambda: not _watch_threads(others), 5, interval=0.05, what="the idle watching thread to end")
        # A later step gets a watching thread again.
        with StepWatch(client, heartbeat_key="hb:again", cancel_key="other", ttl_s=30):
            assert len(_watch_threads(others)) == 1
    finally:
        server.close()


def test_a_cancel_interrupts_each_step_watched_by_the_shared_thread() -> None:
    server = RedisServer()
    server.start()
    try:
        client = redis.Redis.from_url(server.url)
        interrupted: list[str] = []

        def step(name: str, cancel_key: str) -> None:
            if _run_until_interrupted(
                StepWatch(client, heartbeat_key=f"hb:{name}", cancel_key=cancel_key, ttl_s=30), 10
            ):
                interrupted.append(name)

        threads = [threading.Thread(target=step, args=(n, f"cancel:{n[0]}")) for n in ("a1", "a2", "b1")]
        for thread in threads:
            thread.start()
        wait_for(lambda: client.exists("hb:a1", "hb:a2", "hb:b1") == 3, 5, interval=0.05, what="steps running")
        client.set("cancel:a", "1")  # cancels the run of a1 and a2, not b1's
        wait_for(lambda: sorted(interrupted) == ["a1", "a2"], 3, interval=0.05, what="a1 and a2 interrupted")
        assert threads[2].is_alive()
        client.set("cancel:b", "1")
        wait_for(lambda: "b1" in interrupted, 3, interval=0.05, what="b1 interrupted")
        for thread in threads:
            thread.join(5)
    finally:
        server.close()


class _BrokenOnce(StepWatch):
    """A watch whose first flag check fails in a way nobody foresaw."""

    failed = False

    def queue_flag_check(self, pipe: Any) -> int:
        if not self.failed:
            self.failed = True
            raise ValueError("unforeseen")
        return super().queue_flag_check(pipe)


def test_a_poll_that_fails_unforeseen_does_not_end_the_watching_thread() -> None:
    """Without the thread no heartbeat of the process is refreshed, and every step running longer
    than a TTL would be taken for lost and run again."""
    server = RedisServer()
    server.start()
    try:
        client = redis.Redis.from_url(server.url)
        broken = _BrokenOnce(client, heartbeat_key="hb:broken", cancel_key="cancel", ttl_s=30)
        healthy = StepWatch(client, heartbeat_key="hb:healthy", cancel_key="cancel", ttl_s=3)  # refreshed every 0.75 s
        with broken, healthy:
            wait_for(lambda: broken.failed, 5, interval=0.02, what="the failing poll")
            left_ms = client.pttl("hb:healthy")
            # A key's time to live only goes down, unless it is written again: by a later poll.
            wait_for(lambda: client.pttl("hb:healthy") > left_ms, 3, interval=0.05, what="a later heartbeat")
    finally:
        server.close()


def test_a_step_whose_heartbeat_cannot_be_refreshed_stops_before_the_heartbeat_expires() -> None:
    """Lease discipline: recovery re-queues an attempt once its heartbeat expires on Redis's clock,
    and another worker runs it. A worker cut off from Redis (here Redis frozen: the watching thread
    hangs in its call, as behind a partition) must have stopped the step by then. Before, the step
    ran on: the same step twice at once."""
    server = RedisServer()
    server.start()
    try:
        assert server.proc is not None
        client = redis.Redis.from_url(server.url)  # no socket timeout: a frozen server blocks for ever
        # Made in the step's thread: the thread it interrupts.
        watches: list[StepWatch] = []
        stopped_at: list[float] = []

        def step() -> None:
            watch = StepWatch(redis.Redis.from_url(server.url), heartbeat_key="hb", cancel_key="cancel", ttl_s=3)
            watches.append(watch)
            if _run_until_interrupted(watch, 30):
                stopped_at.append(time.time())

        thread = threading.Thread(target=step)
        thread.start()
        first = wait_for(lambda: client.pexpiretime("hb") > 0 and client.pexpiretime("hb"), 5, what="a heartbeat")
        wait_for(lambda: client.pexpiretime("hb") > first, 5, interval=0.05, what="a refresh")
        expires_ms = client.pexpiretime("hb")  # no later than that, it may only move on
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            wait_for(lambda: stopped_at, 5, interval=0.05, what="the step to stop itself")
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        thread.join(5)
        (watch,) = watches
        assert watch.lease_lost and not (watch.cancelled or watch.fenced or watch.timed_out)
        assert stopped_at[0] * 1000 < expires_ms, f"stopped {stopped_at[0] * 1000 - expires_ms:.0f} ms after expiry"
        print(f"\nstep stopped {expires_ms - stopped_at[0] * 1000:.0f} ms before its heartbeat could expire")
    finally:
        server.close()


def test_a_step_wakes_the_time_keeper_only_when_it_may_have_to_stop_before_the_keepers_next_check() -> None:
    """Every step woke the time-keeping thread as it started, a thread switch a step, though a
    step's first deadline (its lease, a timeout) is mostly far beyond the keeper's next check."""
    server = RedisServer()
    server.start()
    try:
        client = redis.Redis.from_url(server.url)
        stopped: list[tuple[float, StepWatch]] = []

        def short_step() -> None:
            watch = StepWatch(client, heartbeat_key="hb:short", cancel_key="cancel", ttl_s=30, timeout_s=0.1)
            if _run_until_interrupted(watch, 10):
                stopped.append((time.monotonic(), watch))

        with StepWatch(client, heartbeat_key="hb:long", cancel_key="cancel", ttl_s=30):
            wait_for(lambda: heartbeat._keeper_wakes_at - time.monotonic() > 0.7, 5, interval=0.01, what="a sleep")
            generation = heartbeat._generation
            with StepWatch(client, heartbeat_key="hb:other", cancel_key="cancel", ttl_s=30):
                assert heartbeat._generation == generation, "a step first due in 29 s woke the keeper"
            wait_for(lambda: heartbeat._keeper_wakes_at - time.monotonic() > 0.7, 5, interval=0.01, what="a sleep")
            wakes_at = heartbeat._keeper_wakes_at
            thread = threading.Thread(target=short_step)
            thread.start()
            wait_for(lambda: stopped, 5, interval=0.01, what="the short step to time out")
            thread.join(5)
        ((stopped_at, watch),) = stopped
        assert watch.timed_out
        assert stopped_at < wakes_at, "the step due before the keeper's next check was stopped only then"
    finally:
        server.close()


def test_a_process_that_stood_still_past_its_lease_stops_its_step_before_a_refresh(monkeypatch: Any) -> None:
    """A worker frozen (SIGSTOP, a VM pause) past its lease wakes with recovery free to have run its
    attempt elsewhere, and the fence flag may be gone by then: flags live two heartbeat TTLs
    (dispatch.flag_ttl_ms), not a week. The watching thread may wake before the time-keeping one:
    it must stop the step, not refresh the heartbeat, which would renew the lease and hide the
    freeze. Before, the refresh won that race and the step ran on beside its replacement."""
    server = RedisServer()
    server.start()
    try:
        monkeypatch.setattr(heartbeat, "KEEPER_IDLE_S", 60.0)  # only the watching thread can notice
        wait_for(lambda: heartbeat._keeper is None, 10, what="other steps' time keeper to end")
        watch = StepWatch(redis.Redis.from_url(server.url), heartbeat_key="hb", cancel_key="cancel", ttl_s=30)
        interrupted = False
        try:
            with watch:
                asleep = lambda: heartbeat._keeper_wakes_at > time.monotonic() + 10  # noqa: E731
                wait_for(asleep, 5, interval=0.01, what="the time keeper to sleep until the lease's end")
                watch._last_sent -= 60  # as if the process had stood still for a minute
                deadline = time.monotonic() + 3
                while time.monotonic() < deadline:
                    time.sleep(0.01)  # a step at work
        except StepCancelled:
            interrupted = True
        assert interrupted and watch.lease_lost
    finally:
        server.close()
