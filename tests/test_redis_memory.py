"""What a run leaves in Redis: no step results, only service calls' answers, for a short while."""

from __future__ import annotations

from typing import Any

from celery import Celery

from celeryapp.application import ChordbeatCelery
from celeryapp.domain.names import PREFIX
from celeryapp.interfaces import service
from celeryapp.messaging.redis_client import get_redis
from celeryapp.variables import DEFAULT_HEARTBEAT_TTL_S
from celeryapp.worker.database_patience import DATABASE_PATIENCE_S
from celeryapp.worker.dispatch import flag_ttl_ms
from celeryapp.worker.step_events import STOP_FLAG_TTL_S
from tests.support.helpers import run_once, step, wait_for


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


def test_cancel_flags_live_as_long_as_the_attempts_they_stop(app: ChordbeatCelery) -> None:
    """A cancel_previous schedule started again and again: each start cancels the run before it and
    sets its cancel flag. Flags live two heartbeat TTLs (dispatch.flag_ttl_ms), not a week: Redis
    holds the last few seconds' of them, however long the history (issue 35: 117 B each, 1.1 GiB
    for 1,000 minutely cancel_previous schedules)."""
    runs = 30
    service.apply_schedule(app, {"name": "churn", "every": 60, "overlap": "cancel_previous", "steps": [step("a")]})
    for _ in range(runs):
        service.trigger_schedule(app, "churn")
    client = get_redis(app.settings.broker_url)
    pattern = f"{PREFIX}:cancel:*"
    flags = list(client.scan_iter(pattern))
    assert len(flags) == runs - 1
    ttl_ms = flag_ttl_ms(app.settings.heartbeat_ttl_s)
    assert all(0 < client.pttl(flag) <= ttl_ms for flag in flags)
    wait_for(lambda: not list(client.scan_iter(pattern)), ttl_ms / 1000 + 5, interval=0.2, what="the flags to go")


def test_an_operators_stop_flag_outlives_a_claim_waiting_for_the_database() -> None:
    """The stop flag is set before the runner claims (Celery asks ``revoked`` first), and the claim
    may wait for the database for DATABASE_PATIENCE_S: the flag must still be there for the step's
    first heartbeat, which reads it, with a lease to spare."""
    assert STOP_FLAG_TTL_S > DATABASE_PATIENCE_S + 2 * DEFAULT_HEARTBEAT_TTL_S
