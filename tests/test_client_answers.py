"""A caller gets its answer once a worker stored it, even if Celery missed the announcement."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
from celery.result import AsyncResult

from celeryapp.client import ChordbeatClient, answer
from celeryapp.config import Settings
from tests.support.servers import wait_for


def test_an_answer_stored_without_its_announcement_is_read(settings: Settings) -> None:
    """Celery's Redis result consumer, reconnecting, reads what is stored and then subscribes
    again: an answer stored in between is never announced to it. An outage test caught it (the
    answer stored, the caller timing out 20 s later). Here no worker runs: the answer is written
    the way a worker stores it, without the PUBLISH."""
    caller = ChordbeatClient(settings.broker_url, settings.result_backend, timeout_s=10)
    broker = redis.Redis.from_url(settings.broker_url)
    try:
        with ThreadPoolExecutor(1) as pool:
            call = pool.submit(caller.get_schedule, "nightly")
            message = wait_for(lambda: broker.lindex("celery", 0), 10, what="the call on the service queue")
            task_id = json.loads(message)["headers"]["id"]
            stored = {"status": "SUCCESS", "result": {"name": "nightly"}, "traceback": None, "children": []}
            broker.set(f"celery-task-meta-{task_id}", json.dumps({**stored, "task_id": task_id}))
            assert call.result(timeout=8) == {"name": "nightly"}
        assert not broker.exists(f"celery-task-meta-{task_id}"), "the answer is forgotten once read"
    finally:
        broker.delete("celery")
        caller.close()


@pytest.mark.parametrize(
    ("timeout", "reason"),
    [
        (float("nan"), "must be a finite number of seconds above 0, got nan"),
        (float("inf"), "must be a finite number of seconds above 0, got inf"),
        (0, "must be a finite number of seconds above 0, got 0"),
        (-5, "must be a finite number of seconds above 0, got -5"),
        (True, "must be a number of seconds, got bool"),
        ("30", "must be a number of seconds, got str"),
        (None, "must be a number of seconds, got NoneType"),
    ],
)
def test_a_wait_that_could_never_end_or_means_nothing_is_refused(timeout: Any, reason: str) -> None:
    """A NaN timeout waited for ever: every comparison of a deadline with NaN is false."""
    with pytest.raises(ValueError, match=f"^timeout_s: {re.escape(reason)}$"):
        ChordbeatClient("redis://127.0.0.1:1/0", timeout_s=timeout)
    caller = ChordbeatClient("redis://127.0.0.1:1/0")
    with pytest.raises(ValueError, match=f"^timeout_s: {re.escape(reason)}$"):
        answer(AsyncResult("never-sent", app=caller.app), timeout)
    with pytest.raises(ValueError, match=f"^timeout_s: {re.escape(reason)}$"):
        caller.worker_listening(timeout)
    caller.close()
