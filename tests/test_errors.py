"""Errors raised to callers: one root, and the class names and messages the docs promise."""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import subprocess
import sys
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import update

from celeryapp import contract, errors
from celeryapp.application import ChordbeatCelery
from models import Schedule, ScheduleStatus, transaction
from tests.support.helpers import call, step

#: Exceptions of ours that are not ChordbeatErrors on purpose, and why.
OUTSIDE_THE_ROOT = {
    # A BaseException so that step code catching Exception does not swallow a cancel.
    "celeryapp.errors.StepCancelled",
    # Faults of the broker, not answers: redis-py and kombu must handle them as the connection,
    # Redis and decoding errors they are (reconnect, refuse the message).
    "celeryapp.messaging.failover.PrimaryMoved",
    "celeryapp.messaging.redis_client.UnusableRedisUrl",
    "celeryapp.messaging.serialization.TooDeep",
}
#: Modules run by a tool, not importable on their own (Alembic's environment).
NOT_IMPORTABLE = ("models.migrations",)


def our_modules() -> list[str]:
    """Every module of ours, in subpackages too."""
    names = []
    for package in ("celeryapp", "tasks", "models"):
        module = importlib.import_module(package)
        names.append(package)
        names += [
            info.name
            for info in pkgutil.walk_packages(module.__path__, f"{package}.")
            if not info.name.startswith(NOT_IMPORTABLE)
        ]
    return names


def test_the_walk_reaches_the_subpackages() -> None:
    names = our_modules()
    assert {"celeryapp.worker.firing", "celeryapp.interfaces.web.hashing", "celeryapp.domain.calendars"} <= set(names)


def test_every_exception_class_of_ours_derives_from_the_root() -> None:
    outside = set()
    for name in our_modules():
        module = importlib.import_module(name)
        for value in vars(module).values():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == name
                and not issubclass(value, errors.ChordbeatError)
            ):
                outside.add(f"{name}.{value.__name__}")
    assert outside == OUTSIDE_THE_ROOT


@pytest.mark.parametrize("documented", contract.CALLER_ERRORS, ids=lambda e: e.exc_type)
def test_each_documented_error_is_a_class_of_ours_with_the_documented_bases(documented: contract.CallerError) -> None:
    cls = getattr(errors, documented.exc_type)
    assert issubclass(cls, errors.ChordbeatError)
    builtins = {c.__name__ for c in cls.__mro__ if c.__module__ == "builtins"} - {
        "Exception",
        "BaseException",
        "object",
    }
    assert builtins == ({documented.builtin} if documented.builtin else set())


#: One refusal per service task: (task, kwargs, exc_type, message).
REFUSALS = [
    ("apply_schedule", {"definition": {"name": "x", "every": "often", "steps": []}}, "DefinitionError", "every: "),
    ("delete_schedule", {"name": "missing"}, "NotFound", "schedule 'missing' does not exist"),
    ("get_schedule", {"name": 7}, "InvalidArgument", "name: must be a schedule name (a string), got int"),
    ("list_schedules", {"limit": 0}, "InvalidArgument", "limit: must be an integer between 1 and 5000, got 0"),
    ("pause_schedule", {"name": "finished"}, "InvalidTransition", "schedule 'finished' is done; only an active"),
    ("resume_schedule", {"name": "finished"}, "InvalidTransition", "schedule 'finished' is done; only a paused"),
    ("trigger_schedule", {"name": "missing"}, "NotFound", "schedule 'missing' does not exist"),
    ("cancel_execution", {"execution_id": 999}, "NotFound", "execution 999 does not exist"),
    ("get_execution", {"execution_id": "17"}, "InvalidArgument", "execution_id: must be an integer"),
    ("list_executions", {"status": "lost"}, "InvalidArgument", "status: must be one of in_progress, completed"),
    ("list_slots", {"name": "missing"}, "NotFound", "schedule 'missing' does not exist"),
    ("rerun_execution", {"execution_id": 999}, "NotFound", "execution 999 does not exist"),
    ("list_audit", {"limit": 501}, "InvalidArgument", "limit: must be an integer between 1 and 500, got 501"),
    ("list_alerts", {"status": "loud"}, "InvalidArgument", "status: must be one of "),
    ("get_alert", {"id": "failed/missing/execution-1"}, "NotFound", "alert 'failed/missing/execution-1' does not"),
    ("acknowledge_alert", {"id": "failed/missing/execution-1"}, "NotFound", "alert 'failed/missing/execution-1'"),
    ("silence_schedule", {"name": "missing", "until": "tomorrow"}, "InvalidArgument", "until: is not an ISO 8601"),
    ("unsilence_schedule", {"name": "missing"}, "NotFound", "schedule 'missing' does not exist"),
    ("test_alert", {"channel": 7}, "InvalidArgument", "channel: must be a channel's name (a string), got int"),
    ("next_fires", {"name": "missing"}, "NotFound", "schedule 'missing' does not exist"),
    (
        "backfill_schedule",
        {"name": "finished", "start": "2026-01-02T00:00:00Z", "end": "2026-01-01T00:00:00Z"},
        "InvalidArgument",
        "end: 2026-01-01T00:00:00.000Z is before start",
    ),
    ("cancel_backfill", {"backfill_id": 999}, "NotFound", "backfill 999 does not exist"),
    ("get_backfill", {"backfill_id": True}, "InvalidArgument", "backfill_id: must be an integer"),
    ("list_backfills", {"name": "missing"}, "NotFound", "schedule 'missing' does not exist"),
    ("apply_limit", {"definition": {"name": "x", "slots": 0}}, "DefinitionError", "slots: must be between 1 and"),
    ("list_limits", {"limit": 5}, "InvalidArgument", "arguments: got an unexpected keyword argument 'limit'"),
    ("get_limit", {"name": "missing"}, "NotFound", "limit 'missing' does not exist"),
    ("delete_limit", {"name": "missing", "force": True}, "NotFound", "limit 'missing' does not exist"),
    ("list_versions", {"name": "missing"}, "NotFound", "schedule 'missing' does not exist"),
    ("get_version", {"name": "missing", "version": 0}, "InvalidArgument", "version: must be"),
    ("diff_versions", {"name": "missing", "a": 1, "b": True}, "InvalidArgument", "b: must be"),
    ("rollback_schedule", {"name": "missing", "version": 1}, "NotFound", "schedule 'missing' does not exist"),
]

PLAIN_CALLER = """
import json, sys
from celery import Celery
client = Celery(broker=sys.argv[1], backend=sys.argv[1])
client.conf.update(task_serializer="json", accept_content=["json"], result_accept_content=["json"])
seen = []
for task, kwargs in json.loads(sys.argv[2]):
    try:
        client.send_task(task, kwargs=kwargs).get(timeout=30)
        seen.append(None)
    except Exception as exc:
        seen.append([type(exc).__name__, str(exc)])
assert "celeryapp" not in sys.modules
print(json.dumps(seen))
"""


def test_each_service_tasks_refusal_reaches_a_plain_caller_with_the_documented_exc_type(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    call(client, "chordbeat.apply_schedule", definition={"name": "finished", "every": 60, "steps": [step("s")]})
    with transaction(app.settings.database_url) as session:
        session.execute(update(Schedule).where(Schedule.name == "finished").values(status=ScheduleStatus.DONE))
    calls = [[f"chordbeat.{task}", kwargs] for task, kwargs, _, _ in REFUSALS]
    url = app.settings.broker_url
    done = subprocess.run(
        [sys.executable, "-c", PLAIN_CALLER, url, json.dumps(calls)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    documented = {t.name.removeprefix("chordbeat."): ("InvalidArgument", *t.errors) for t in contract.SERVICE_TASKS}
    assert {task for task, *_ in REFUSALS} == set(documented)
    for (task, _kwargs, exc_type, message), answer in zip(REFUSALS, seen, strict=True):
        assert answer is not None, task
        assert answer[0] == exc_type and answer[0] in documented[task], (task, answer)
        assert answer[1].startswith(message), (task, answer)
