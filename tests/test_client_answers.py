"""A caller gets its answer once a worker stored it, even if Celery missed the announcement."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import redis

from celeryapp.client import ChordbeatClient
from celeryapp.config import Settings
from tests.servers import wait_for


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
