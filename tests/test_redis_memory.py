"""What a run leaves in Redis: no step results, only service calls' answers, for a short while."""

from __future__ import annotations

from typing import Any

from celery import Celery

from celeryapp.application import ChordbeatCelery
from celeryapp.messaging.redis_client import get_redis
from tests.helpers import run_once, step


def test_steps_store_no_result_and_chords_still_advance(app: ChordbeatCelery, worker: Any, client: Celery) -> None:
    # Groups of two and three steps: the chords count their headers without any stored result.
    definition = {"name": "lean", "every": 3600, "steps": [[step("a"), step("b")], [step("c"), step("d"), step("e")]]}
    run = run_once(client, definition)
    assert run["status"] == "completed"
    assert [a["status"] for a in run["activities"]] == ["complete"] * 5
    redis_client = get_redis(app.settings.result_backend)
    results = list(redis_client.scan_iter("celery-task-meta-*"))
    assert not [key for key in results if key.startswith("celery-task-meta-chordbeat-")], results
    # What is stored (the service calls' answers, read by their callers at once) expires soon.
    assert results
    assert all(0 < redis_client.ttl(key) <= app.settings.result_expires_s for key in results)
