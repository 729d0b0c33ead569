"""The watch beside a running step: what it sees after its process or Redis was frozen."""

from __future__ import annotations

import os
import signal
import time

import redis

from celeryapp.execution.heartbeat import CANCEL_POLL_S, StepWatch
from tests.servers import RedisServer, wait_for


def _exists_calls(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_exists", {}).get("calls", 0))


def test_a_look_that_outlasted_a_poll_is_made_again_at_once() -> None:
    """A look at the cancel and fence flags that took longer than a poll may answer from before a
    freeze (a SIGSTOP or VM pause of the worker, a stalled Redis): recovery may have fenced the
    attempt meanwhile. The watch looks again at once instead of a poll later (the chaos test saw a
    fenced step run on for a poll after its worker woke)."""
    server = RedisServer()
    server.start()
    try:
        assert server.proc is not None
        client = redis.Redis.from_url(server.url)
        # One EXISTS a look (no fence or stop key); the heartbeat is refreshed every 10 s only.
        watch = StepWatch(redis.Redis.from_url(server.url), heartbeat_key="hb", cancel_key="cancel", ttl_s=30)
        with watch:
            wait_for(lambda: _exists_calls(client) >= 1, 5, interval=0.05, what="the watch's first look")
            before = _exists_calls(client)
            os.kill(server.proc.pid, signal.SIGSTOP)
            try:
                time.sleep(2 * CANCEL_POLL_S + 0.2)  # the outage's length, not a synchronisation
            finally:
                os.kill(server.proc.pid, signal.SIGCONT)
            resumed = time.monotonic()
            # The look made during the outage, answered now, and the one made at once after it.
            wait_for(lambda: _exists_calls(client) >= before + 2, 2, interval=0.02, what="a second look")
            assert time.monotonic() - resumed < CANCEL_POLL_S * 0.7, "the second look waited for the next poll"
        assert not (watch.cancelled or watch.fenced or watch.timed_out)
    finally:
        server.close()
