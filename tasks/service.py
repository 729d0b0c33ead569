"""The tasks other services call by name with ``send_task``; JSON in, JSON out."""

from __future__ import annotations

import inspect
from typing import Any

from celeryapp import app
from celeryapp.domain.redaction import RedactedResult
from celeryapp.errors import ChordbeatError, InvalidArgument
from celeryapp.interfaces import service
from celeryapp.messaging.expiry import ReferenceClockTask


class ServiceTask(ReferenceClockTask):
    """A service task: arguments checked against its signature, answers redacted for logs.

    A plain ``send_task`` is not checked against the signature by the caller; without the check the
    caller would get a bare ``TypeError`` from deep inside the worker, so it raises
    :class:`InvalidArgument`. Answers reach the caller whole; worker logs and Flower see payloads
    and ``env`` values hidden.
    """

    #: Refusals are answers, not worker faults: logged without a traceback.
    throws = (ChordbeatError,)

    def __call__(self, *args: Any, **kwargs: Any) -> RedactedResult:
        try:
            inspect.signature(self.run).bind(*args, **kwargs)
        except TypeError as exc:
            raise InvalidArgument("arguments", str(exc)) from None
        return RedactedResult(super().__call__(*args, **kwargs))


#: Read-only calls (the CLI's polling among them) send no task events: they would drown what
#: changed anything in Flower's task list.
READ_ONLY_EVENTS = False


@app.task(base=ServiceTask, name="chordbeat.apply_schedule")
def apply_schedule(definition: dict[str, Any]) -> dict[str, Any]:
    return service.apply_schedule(app, definition)


@app.task(base=ServiceTask, name="chordbeat.delete_schedule")
def delete_schedule(name: str) -> dict[str, Any]:
    return service.delete_schedule(app, name)


@app.task(base=ServiceTask, name="chordbeat.get_schedule", send_events=READ_ONLY_EVENTS)
def get_schedule(name: str) -> dict[str, Any]:
    return service.get_schedule(app, name)


@app.task(base=ServiceTask, name="chordbeat.list_schedules", send_events=READ_ONLY_EVENTS)
def list_schedules(limit: int = 500, after_name: str | None = None) -> list[dict[str, Any]]:
    return service.list_schedules(app, limit, after_name)


@app.task(base=ServiceTask, name="chordbeat.pause_schedule")
def pause_schedule(name: str) -> dict[str, Any]:
    return service.pause_schedule(app, name)


@app.task(base=ServiceTask, name="chordbeat.resume_schedule")
def resume_schedule(name: str) -> dict[str, Any]:
    return service.resume_schedule(app, name)


@app.task(base=ServiceTask, name="chordbeat.trigger_schedule")
def trigger_schedule(name: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
    return service.trigger_schedule(app, name, payload)


@app.task(base=ServiceTask, name="chordbeat.cancel_execution")
def cancel_execution(execution_id: int) -> dict[str, Any]:
    return service.cancel_execution(app, execution_id)


@app.task(base=ServiceTask, name="chordbeat.get_execution", send_events=READ_ONLY_EVENTS)
def get_execution(execution_id: int) -> dict[str, Any]:
    return service.get_execution(app, execution_id)


@app.task(base=ServiceTask, name="chordbeat.list_executions", send_events=READ_ONLY_EVENTS)
def list_executions(
    schedule: str | None = None, status: str | None = None, limit: int = 50, before_id: int | None = None
) -> list[dict[str, Any]]:
    return service.list_executions(app, schedule, status, limit, before_id)


@app.task(base=ServiceTask, name="chordbeat.list_slots", send_events=READ_ONLY_EVENTS)
def list_slots(name: str, limit: int = 50) -> list[dict[str, Any]]:
    return service.list_slots(app, name, limit)
