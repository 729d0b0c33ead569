"""The tasks other services call by name with ``send_task``; JSON in, JSON out."""

from __future__ import annotations

import inspect
from typing import Any

from celeryapp import app
from celeryapp.contract import SOURCE_HEADER
from celeryapp.domain.redaction import RedactedResult
from celeryapp.errors import ChordbeatError, InvalidArgument
from celeryapp.interfaces import alerts, backfill_service, limit_service, service, version_service, wiring_checks
from celeryapp.interfaces import next_fires as fire_preview
from celeryapp.interfaces.arguments import default_actor
from celeryapp.messaging.expiry import ReferenceClockTask
from celeryapp.states import AuditSource
from models.audit import claimed_source


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
        with claimed_source(_claim()):
            return RedactedResult(super().__call__(*args, **kwargs))


def _claim() -> str | None:
    """The source the message being run claims (``chordbeat_source`` header), as text; None without one."""
    request = app.current_task.request if app.current_task is not None else None
    claimed = getattr(request, SOURCE_HEADER, None) or (getattr(request, "headers", None) or {}).get(SOURCE_HEADER)
    return None if claimed is None else str(claimed)


def _caller(actor: Any) -> dict[str, Any]:
    """The audit's actor and source of the call being run: the source is always ``service``.
    Anyone who can publish to the broker can claim ``cli`` (or ``web``, ``beat``) in a header and
    name any actor, so only what chordbeat itself knows is recorded as a source: the CLI writing
    in-process, the dashboard's session user, beat. The claim is kept in the row's detail
    (:func:`models.audit.claimed_source`). No actor given: the caller's Celery origin
    (``gen<pid>@<host>``), so a row never lacks one."""
    request = app.current_task.request if app.current_task is not None else None
    source = AuditSource.SERVICE
    if actor is None:
        actor = default_actor(source, getattr(request, "origin", None)).name
    return {"actor": actor, "source": source}


#: Read-only calls (the CLI's polling among them) send no task events: they would drown what
#: changed anything in Flower's task list.
READ_ONLY_EVENTS = False


@app.task(base=ServiceTask, name="chordbeat.apply_schedule")
def apply_schedule(definition: dict[str, Any], actor: str | None = None, reason: str | None = None) -> dict[str, Any]:
    return service.apply_schedule(app, definition, reason=reason, **_caller(actor))


@app.task(base=ServiceTask, name="chordbeat.delete_schedule")
def delete_schedule(name: str, actor: str | None = None, reason: str | None = None) -> dict[str, Any]:
    return service.delete_schedule(app, name, reason=reason, **_caller(actor))


@app.task(base=ServiceTask, name="chordbeat.get_schedule", send_events=READ_ONLY_EVENTS)
def get_schedule(name: str) -> dict[str, Any]:
    return service.get_schedule(app, name)


@app.task(base=ServiceTask, name="chordbeat.list_schedules", send_events=READ_ONLY_EVENTS)
def list_schedules(limit: int = 500, after_name: str | None = None) -> list[dict[str, Any]]:
    return service.list_schedules(app, limit, after_name)


@app.task(base=ServiceTask, name="chordbeat.pause_schedule")
def pause_schedule(name: str, actor: str | None = None, reason: str | None = None) -> dict[str, Any]:
    return service.pause_schedule(app, name, reason=reason, **_caller(actor))


@app.task(base=ServiceTask, name="chordbeat.resume_schedule")
def resume_schedule(name: str, actor: str | None = None, reason: str | None = None) -> dict[str, Any]:
    return service.resume_schedule(app, name, reason=reason, **_caller(actor))


@app.task(base=ServiceTask, name="chordbeat.trigger_schedule")
def trigger_schedule(
    name: str, payload: dict[str, Any] | None = None, actor: str | None = None, reason: str | None = None
) -> dict[str, Any]:
    return service.trigger_schedule(app, name, payload, reason=reason, **_caller(actor))


@app.task(base=ServiceTask, name="chordbeat.cancel_execution")
def cancel_execution(execution_id: int, actor: str | None = None, reason: str | None = None) -> dict[str, Any]:
    return service.cancel_execution(app, execution_id, reason=reason, **_caller(actor))


@app.task(base=ServiceTask, name="chordbeat.rerun_execution")
def rerun_execution(
    execution_id: int,
    from_failed: bool = True,
    actor: str | None = None,
    reason: str | None = None,
    payload: dict[str, Any] | None = None,
    latest: bool = False,
) -> dict[str, Any]:
    return service.rerun_execution(
        app, execution_id, from_failed, reason=reason, payload=payload, latest=latest, **_caller(actor)
    )


@app.task(base=ServiceTask, name="chordbeat.get_execution", send_events=READ_ONLY_EVENTS)
def get_execution(execution_id: int) -> dict[str, Any]:
    return service.get_execution(app, execution_id)


@app.task(base=ServiceTask, name="chordbeat.list_executions", send_events=READ_ONLY_EVENTS)
def list_executions(
    schedule: str | None = None,
    status: str | None = None,
    limit: int = 50,
    before_id: int | None = None,
    version: int | None = None,
) -> list[dict[str, Any]]:
    return service.list_executions(app, schedule, status, limit, before_id, version)


@app.task(base=ServiceTask, name="chordbeat.list_slots", send_events=READ_ONLY_EVENTS)
def list_slots(name: str, limit: int = 50) -> list[dict[str, Any]]:
    return service.list_slots(app, name, limit)


@app.task(base=ServiceTask, name="chordbeat.next_fires", send_events=READ_ONLY_EVENTS)
def next_fires(name: str, count: int = 10) -> list[dict[str, Any]]:
    return fire_preview.next_fires(app, name, count)


@app.task(base=ServiceTask, name="chordbeat.list_versions", send_events=READ_ONLY_EVENTS)
def list_versions(name: str, limit: int = 50, before: int | None = None) -> list[dict[str, Any]]:
    return version_service.list_versions(app, name, limit, before)


@app.task(base=ServiceTask, name="chordbeat.get_version", send_events=READ_ONLY_EVENTS)
def get_version(name: str, version: int) -> dict[str, Any]:
    return version_service.get_version(app, name, version)


@app.task(base=ServiceTask, name="chordbeat.diff_versions", send_events=READ_ONLY_EVENTS)
def diff_versions(name: str, a: int, b: int) -> list[dict[str, Any]]:
    return version_service.diff_versions(app, name, a, b)


@app.task(base=ServiceTask, name="chordbeat.rollback_schedule")
def rollback_schedule(name: str, version: int, actor: str | None = None, reason: str | None = None) -> dict[str, Any]:
    return version_service.rollback_schedule(app, name, version, reason=reason, **_caller(actor))


@app.task(base=ServiceTask, name="chordbeat.backfill_schedule")
def backfill_schedule(
    name: str,
    start: str,
    end: str,
    mode: str = "missing",
    max_concurrent: int = 1,
    dry_run: bool = False,
    actor: str | None = None,
    reason: str | None = None,
    version: int | None = None,
) -> dict[str, Any]:
    return backfill_service.backfill_schedule(
        app, name, start, end, mode, max_concurrent, dry_run, reason=reason, version=version, **_caller(actor)
    )


@app.task(base=ServiceTask, name="chordbeat.cancel_backfill")
def cancel_backfill(backfill_id: int, actor: str | None = None, reason: str | None = None) -> dict[str, Any]:
    return backfill_service.cancel_backfill(app, backfill_id, reason=reason, **_caller(actor))


@app.task(base=ServiceTask, name="chordbeat.get_backfill", send_events=READ_ONLY_EVENTS)
def get_backfill(backfill_id: int) -> dict[str, Any]:
    return backfill_service.get_backfill(app, backfill_id)


@app.task(base=ServiceTask, name="chordbeat.list_backfills", send_events=READ_ONLY_EVENTS)
def list_backfills(name: str, limit: int = 20) -> list[dict[str, Any]]:
    return backfill_service.list_backfills(app, name, limit)


@app.task(base=ServiceTask, name="chordbeat.list_audit", send_events=READ_ONLY_EVENTS)
def list_audit(
    schedule: str | None = None,
    limit: int = 50,
    execution_id: int | None = None,
    actor: str | None = None,
    action: str | None = None,
    since: str | None = None,
    until: str | None = None,
    before_id: int | None = None,
) -> list[dict[str, Any]]:
    return service.list_audit(
        app,
        schedule,
        limit,
        execution_id=execution_id,
        actor=actor,
        action=action,
        since=since,
        until=until,
        before_id=before_id,
    )


@app.task(base=ServiceTask, name="chordbeat.list_alerts", send_events=READ_ONLY_EVENTS)
def list_alerts(schedule: str | None = None, status: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
    return alerts.list_alerts(app, schedule, status, limit)


@app.task(base=ServiceTask, name="chordbeat.get_alert", send_events=READ_ONLY_EVENTS)
def get_alert(id: str) -> dict[str, Any]:
    return alerts.get_alert(app, id)


@app.task(base=ServiceTask, name="chordbeat.acknowledge_alert")
def acknowledge_alert(id: str, actor: str | None = None, reason: str | None = None) -> dict[str, Any]:
    return alerts.acknowledge_alert(app, id, reason=reason, **_caller(actor))


@app.task(base=ServiceTask, name="chordbeat.silence_schedule")
def silence_schedule(name: str, until: str, reason: str | None = None, actor: str | None = None) -> dict[str, Any]:
    return alerts.silence_schedule(app, name, until, reason=reason, **_caller(actor))


@app.task(base=ServiceTask, name="chordbeat.unsilence_schedule")
def unsilence_schedule(name: str, actor: str | None = None, reason: str | None = None) -> dict[str, Any]:
    return alerts.unsilence_schedule(app, name, reason=reason, **_caller(actor))


@app.task(base=ServiceTask, name="chordbeat.test_alert")
def test_alert(channel: str, actor: str | None = None, reason: str | None = None) -> dict[str, Any]:
    return wiring_checks.test_alert(app, channel, reason=reason, **_caller(actor))


@app.task(base=ServiceTask, name="chordbeat.apply_limit")
def apply_limit(
    definition: dict[str, Any], actor: str | None = None, reason: str | None = None, expected_version: int | None = None
) -> dict[str, Any]:
    return limit_service.apply_limit(
        app, definition, reason=reason, expected_version=expected_version, **_caller(actor)
    )


@app.task(base=ServiceTask, name="chordbeat.list_limits", send_events=READ_ONLY_EVENTS)
def list_limits() -> list[dict[str, Any]]:
    return limit_service.list_limits(app)


@app.task(base=ServiceTask, name="chordbeat.get_limit", send_events=READ_ONLY_EVENTS)
def get_limit(name: str) -> dict[str, Any]:
    return limit_service.get_limit(app, name)


@app.task(base=ServiceTask, name="chordbeat.delete_limit")
def delete_limit(name: str, force: bool = False, actor: str | None = None, reason: str | None = None) -> dict[str, Any]:
    return limit_service.delete_limit(app, name, force, reason=reason, **_caller(actor))
