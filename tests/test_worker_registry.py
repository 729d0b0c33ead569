"""The registry of what live workers can run (monitoring/worker_registry.py), on a real Redis:
definitions are checked against the workers that consume each step's queue."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from celeryapp.config import Settings
from celeryapp.domain.step_policy import StepRules
from celeryapp.domain.validation import parse_definition
from celeryapp.errors import DefinitionError
from celeryapp.messaging import keys
from celeryapp.messaging.redis_client import get_redis, reset_clients
from celeryapp.monitoring import worker_registry
from celeryapp.monitoring.worker_registry import checked_rules, live_workers, publish
from tests.support.servers import RedisServer, wait_for

NOTHING_HERE = StepRules.of(Settings(), lambda task: False).registered


@pytest.fixture
def settings(redis_server: RedisServer) -> Iterator[Settings]:
    """This process's settings: the shared Redis, emptied; no database needed."""
    redis.Redis.from_url(redis_server.url).flushall()
    reset_clients()
    yield Settings(broker_url=redis_server.url, task_modules=("hr.steps",))


def definition(*steps: dict[str, Any]) -> dict[str, Any]:
    return {"name": "hr", "every": 60, "steps": list(steps)}


def test_a_step_is_checked_against_the_union_of_the_live_workers_of_its_queue(settings: Settings) -> None:
    client = get_redis(settings.broker_url)
    policy = Settings(step_tasks=("hr.*", "billing.*"))
    publish(client, "steps1@a", ["chordbeat"], ["hr.import_people"], policy, ttl_s=60)
    publish(client, "steps2@b", ["chordbeat", "reports"], ["billing.close"], policy, ttl_s=60)
    publish(client, "control1@a", ["chordbeat.control", "celery"], ["hr.only_on_control"], policy, ttl_s=60)
    checked = checked_rules(settings, NOTHING_HERE)
    assert checked.fallback is None
    # Either worker of the default queue has it: accepted, though this process has neither.
    parse_definition(
        definition({"name": "a", "task": "hr.import_people"}, {"name": "b", "task": "billing.close"}),
        rules=checked.rules,
    )
    parse_definition(definition({"name": "r", "task": "billing.close", "queue": "reports"}), rules=checked.rules)
    # On 'reports' only steps2 runs steps: steps1's task is not there; the control worker's never counts.
    for step in (
        {"name": "r", "task": "hr.import_people", "queue": "reports"},
        {"name": "c", "task": "hr.only_on_control"},
    ):
        with pytest.raises(DefinitionError, match="is not registered on the workers of queue"):
            parse_definition(definition(step), rules=checked.rules)
    # Not allowed by any worker's CHORDBEAT_STEP_TASKS: refused though registered.
    publish(client, "steps3@c", ["chordbeat"], ["ops.purge"], policy, ttl_s=60)
    with pytest.raises(DefinitionError, match="CHORDBEAT_STEP_TASKS"):
        parse_definition(
            definition({"name": "p", "task": "ops.purge"}), rules=checked_rules(settings, NOTHING_HERE).rules
        )


def test_an_expired_worker_is_ignored_and_a_stopped_one_forgotten(settings: Settings) -> None:
    client = get_redis(settings.broker_url)
    publish(client, "gone@a", ["chordbeat"], ["hr.import_people"], Settings(), ttl_s=1)
    publish(client, "live@b", ["chordbeat"], ["billing.close"], Settings(), ttl_s=60)
    assert {e.node for e in live_workers(client)} == {"gone@a", "live@b"}
    wait_for(lambda: not client.exists(keys.registry_key("gone@a")), 10, what="the entry to expire")
    assert [e.node for e in live_workers(client)] == ["live@b"]
    assert client.smembers(keys.REGISTRY_NODES_KEY) == {"live@b"}
    rules = checked_rules(settings, NOTHING_HERE).rules
    assert rules.task_refusal("billing.close") is None
    assert rules.task_refusal("hr.import_people") is not None
    worker_registry.forget(client, "live@b")
    assert live_workers(client) == []


def test_with_no_worker_published_this_process_checks_and_says_so(settings: Settings) -> None:
    checked = checked_rules(settings, {"hr.import_people"}.__contains__)
    assert checked.fallback == (
        "no worker has published its tasks; checked against this process's tasks (CHORDBEAT_TASK_MODULES=hr.steps)"
    )
    assert checked.rules.task_refusal("hr.import_people") is None
    refusal = checked.rules.task_refusal("hr.import_peple")
    assert refusal is not None and "not registered in this process" in refusal
    assert "CHORDBEAT_TASK_MODULES=hr.steps" in refusal


def test_an_unreadable_entry_is_left_out(settings: Settings) -> None:
    client = get_redis(settings.broker_url)
    client.sadd(keys.REGISTRY_NODES_KEY, "odd@x")
    client.set(keys.registry_key("odd@x"), "{not json", ex=60)
    publish(client, "live@b", ["chordbeat"], ["billing.close"], Settings(), ttl_s=60)
    assert [e.node for e in live_workers(client)] == ["live@b"]


def test_redis_down_falls_back_to_this_process(settings: Settings) -> None:
    nowhere = Settings(broker_url="redis://127.0.0.1:1/0")  # port 1: nothing listens, refused at once
    checked = checked_rules(nowhere, {"hr.import_people"}.__contains__)
    assert checked.fallback is not None and "could not be read" in checked.fallback
    assert checked.rules.task_refusal("hr.import_people") is None
