"""Helpers shared by the test modules: calling the service, waiting for runs, reading state.

Test modules import from here (or from tests.support.servers and tests.support.processes), never from each other.
"""

from __future__ import annotations

import base64
import json
import types
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from celery import Celery
from sqlalchemy import event, select

from celeryapp.application import ChordbeatCelery
from celeryapp.client import answer
from celeryapp.domain.names import CONTROL_QUEUE
from celeryapp.execution.runs import start_execution
from celeryapp.interfaces import service
from celeryapp.interfaces.objects import execution_json
from celeryapp.messaging.redis_client import get_redis
from celeryapp.scheduling import queued_fires
from celeryapp.scheduling.beat_entries import ScheduleEntry, entry_name
from models import Schedule, ScheduleExecution, Trigger, WorkerTask, get_engine, transaction, utcnow
from tests.support.servers import wait_for

__all__ = [
    "call",
    "db_execution",
    "entry_exists",
    "execution",
    "executions",
    "finished",
    "fire_messages",
    "http_get",
    "rode_out",
    "run_once",
    "running",
    "set_field",
    "start_and_hold",
    "step",
    "take_fires",
    "ts",
    "wait_for",
]


def call(client: Celery, task_name: str, /, **kwargs: Any) -> Any:
    """Call a chordbeat service task by name and wait for its JSON answer."""
    return answer(client.send_task(task_name, kwargs=kwargs), 20)


def step(name: str, task: str = "chordbeat.examples.sleep", **extra: Any) -> dict[str, Any]:
    kwargs = {"seconds": 0.05} if task.endswith("sleep") else {"message": f"{name} says so"}
    return {"name": name, "task": task, "kwargs": extra.pop("kwargs", kwargs), **extra}


def finished(client: Celery, execution_id: int, timeout: float = 30) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        execution = call(client, "chordbeat.get_execution", execution_id=execution_id)
        return execution if execution["status"] != "in_progress" else None

    result = wait_for(done, timeout, interval=0.1, what=f"execution {execution_id} to finish")
    assert isinstance(result, dict)
    return result


def ts(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def execution(client: Celery, execution_id: int) -> dict[str, Any]:
    result: dict[str, Any] = call(client, "chordbeat.get_execution", execution_id=execution_id)
    return result


def running(client: Celery, execution_id: int, step_name: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        for activity in execution(client, execution_id)["activities"]:
            if activity["step"] == step_name and activity["status"] == "in_progress":
                return activity
        return None

    found = wait_for(check, 20, interval=0.05, what=f"{step_name} to run")
    assert isinstance(found, dict)
    return found


def token_of_task(app: ChordbeatCelery, worker_task_id: int) -> int:
    """The token of a worker task's run (it names the attempt's keys and Celery task id)."""
    with transaction(app.settings.database_url, read_only=True) as session:
        return session.scalars(
            select(ScheduleExecution.token)
            .join(WorkerTask, WorkerTask.execution_id == ScheduleExecution.id)
            .where(WorkerTask.id == worker_task_id)
        ).one()


def db_execution(app: ChordbeatCelery, execution_id: int) -> dict[str, Any]:

    with transaction(app.settings.database_url) as session:
        return execution_json(session, session.get_one(ScheduleExecution, execution_id))


def rode_out(
    app: ChordbeatCelery, execution_id: int, schedule: str, since: datetime, fault: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """After a fault: the run that was in flight once it finished, and ``schedule``'s runs started
    after ``since`` once one of them completed (beat fires again and its runs go through)."""
    done = wait_for(
        lambda: (e := db_execution(app, execution_id))["status"] != "in_progress" and e,
        90,
        interval=0.3,
        what=f"the run in flight to finish after the {fault}",
    )
    fresh = wait_for(
        lambda: [
            service.get_execution(app, e["id"])  # whole, with activities (a list holds summaries)
            for e in service.list_executions(app, schedule)
            if ts(e["started_at"]) > since and e["status"] == "completed"
        ],
        90,
        interval=0.3,
        what=f"a run fired by beat after the {fault} to complete",
    )
    assert isinstance(done, dict) and isinstance(fresh, list)
    return done, fresh


def executions(app: ChordbeatCelery) -> list[ScheduleExecution]:
    with transaction(app.settings.database_url) as session:
        return list(session.scalars(select(ScheduleExecution).order_by(ScheduleExecution.id)))


def start_and_hold(app: ChordbeatCelery, name: str) -> tuple[int, Any]:
    """Record a run; return it with the effects (its first chord) still to be sent."""
    with transaction(app.settings.database_url) as session:
        schedule = session.scalar(select(Schedule).where(Schedule.name == name))
        assert schedule is not None
        result = start_execution(session, schedule, trigger=Trigger.MANUAL, run_key=f"{name}:held", now=utcnow())
    assert result.execution_id is not None
    return result.execution_id, result.effects


def fire_messages(app: ChordbeatCelery) -> list[tuple[list[dict[str, str]], str | None]]:
    """(slots, expiry) of each fire message waiting in the control queue."""
    messages = []
    for raw in get_redis(app.settings.broker_url).lrange(CONTROL_QUEUE, 0, -1):
        message = json.loads(raw)
        if message["headers"]["task"] == "chordbeat.fire_batch":
            _args, kwargs, _embed = json.loads(base64.b64decode(message["body"]))
            messages.append((kwargs["fires"], message["headers"]["expires"]))
    return messages


def take_fires(app: ChordbeatCelery, taken: list[str]) -> list[str]:
    """``taken``, extended by the names of the schedules fired since, in order. The control queue's
    messages are taken as a control worker takes them, their queued markers too: with no worker
    running, beat would otherwise send no more fires of a schedule whose last one waits."""
    broker = get_redis(app.settings.broker_url)
    for raw in broker.rpop(CONTROL_QUEUE, 10_000) or []:  # oldest first
        message = json.loads(raw)
        if message["headers"]["task"] == "chordbeat.fire_batch":
            queued_fires.taken(broker, message["headers"]["id"])
            _args, kwargs, _embed = json.loads(base64.b64decode(message["body"]))
            taken.extend(fire["name"] for fire in kwargs["fires"])
    return taken


def entry_exists(app: ChordbeatCelery, name: str) -> bool:
    key = ScheduleEntry.generate_key(app, entry_name(name))
    return bool(get_redis(app.settings.redbeat_url).exists(key))


def set_field(definition: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """Set the field at ``path`` (``steps/1/0/name``) of ``definition``; ``KeyError`` removes it."""
    target: Any = definition
    keys = path.split("/")
    for key in keys[:-1]:
        target = target[int(key)] if key.isdigit() else target[key]
    last = keys[-1]
    if value is KeyError:
        del target[last]
    elif isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return definition


def http_get(url: str, auth: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


def run_once(client: Celery, definition: dict[str, Any]) -> dict[str, Any]:
    call(client, "chordbeat.apply_schedule", definition=definition)
    started = call(client, "chordbeat.trigger_schedule", name=definition["name"])
    return finished(client, started["execution_id"])


@contextmanager
def recorded_statements(
    app: ChordbeatCelery, words: int | None = 1, skip: tuple[str, ...] = ("BEGIN",)
) -> Iterator[list[str]]:
    """The statements run on the app's engine inside the block (their first ``words`` words, all
    of them for None), those starting with ``skip`` left out."""
    statements: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if not statement.startswith(skip):
            statements.append(statement if words is None else " ".join(statement.split()[:words]))

    engine = get_engine(app.settings.database_url)
    event.listen(engine, "before_cursor_execute", record)
    try:
        yield statements
    finally:
        event.remove(engine, "before_cursor_execute", record)


def tells_databases_apart(code: types.CodeType) -> bool:
    """Whether a test's code (nested functions included) names a database kind, as one that does
    something on one only does (``if url.startswith("postgresql")``, ``dialect.name == "sqlite"``)."""
    return any(
        tells_databases_apart(const) if isinstance(const, types.CodeType) else const in ("postgresql", "sqlite")
        for const in code.co_consts
    )


def write_schedule_file(path: Path, *schedules: dict[str, Any], source: str | None = None) -> Path:
    """A schedule file at ``path`` declaring ``schedules`` (and ``source``, when given)."""
    document: dict[str, Any] = {"schedules": list(schedules)}
    if source is not None:
        document["source"] = source
    path.write_text(yaml.safe_dump(document))
    return path
