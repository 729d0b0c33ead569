"""A small typed client for other Python services: calls chordbeat's tasks by name.

It needs only ``celery``, and importing it touches nothing global: it builds no app from the
environment, leaves Celery's current app alone and connects no signal receivers (it imports only
:mod:`celeryapp.contract` and :mod:`celeryapp.answer_shapes`)::

    from celeryapp.client import ChordbeatClient

    chordbeat = ChordbeatClient(broker_url="redis://…", backend_url="redis://…")
    run = chordbeat.trigger_schedule("nightly-hr-sync", payload={"initiator": "hr"})
"""

from __future__ import annotations

import contextlib
import gc
import math
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from celery import Celery
from celery.exceptions import TimeoutError as CeleryTimeoutError
from celery.result import AsyncResult

from celeryapp.answer_shapes import (
    AlertJson,
    AuditJson,
    BackfillAnswerJson,
    BackfillJson,
    DeletedJson,
    ExecutionJson,
    ExecutionSummaryJson,
    ScheduleJson,
    SilenceJson,
    SlotJson,
    TriggerJson,
)
from celeryapp.clock_correction import CORRECTION_KEY, BadCorrection, Correction
from celeryapp.contract import SOURCE_HEADER
from celeryapp.domain.redaction import redact

#: Queue the service tasks are consumed from by every worker (Celery's default queue).
SERVICE_QUEUE = "celery"
DEFAULT_TIMEOUT_S = 30.0
#: Seconds :meth:`ChordbeatClient.worker_listening` waits for a worker's answer.
DEFAULT_PROBE_S = 2.0
#: Seconds between two reads of a call's stored answer while its announcement is awaited.
ANSWER_RECHECK_S = 1.0

Json = dict[str, Any]


def seconds(name: str, value: object) -> float:
    """``value`` as a wait in seconds, or ``ValueError`` naming ``name``: a NaN or infinite wait
    never ends (every deadline comparison with NaN is false)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name}: must be a number of seconds, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}: must be a finite number of seconds above 0, got {value!r}")
    return float(value)


def answer(result: AsyncResult, timeout_s: float) -> Any:
    """The answer of a sent task, also when the message announcing it was missed.

    Celery's Redis result consumer, reconnecting after Redis went away, reads the answers already
    stored and then subscribes again: an answer stored in between is never announced to it, and
    one long ``get`` waits for nothing until it times out (seen in our Redis outage tests;
    celery/celery#4039). Each ``get`` reads the stored answer first, so waiting in slices of
    :data:`ANSWER_RECHECK_S` finds it within a slice, for one Redis read a second.
    """
    deadline = time.monotonic() + seconds("timeout_s", timeout_s)
    while True:
        left = deadline - time.monotonic()
        try:
            return result.get(timeout=max(min(left, ANSWER_RECHECK_S), 0.0))
        except CeleryTimeoutError:
            if left <= ANSWER_RECHECK_S:
                raise


class ChordbeatClient:
    """Calls the contract's service tasks and waits for their JSON answers.

    Errors raised by a task (an invalid definition, an unknown name) are raised here with the
    worker's message, which names the field and the reason. ``source="cli"`` claims every call is
    the CLI's: the audit trail records it as ``service`` (anyone on the broker can claim it) and
    keeps the claim in the row's detail (``claimed_source``).
    """

    def __init__(
        self,
        broker_url: str | None = None,
        backend_url: str | None = None,
        *,
        app: Celery | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        sentinel_master: str = "mymaster",
        source: str = "service",
    ) -> None:
        self.timeout_s = seconds("timeout_s", timeout_s)
        self.source = source
        if app is None:
            app = Celery("chordbeat-client", broker=broker_url, backend=backend_url or broker_url, set_as_current=False)
            app.conf.update(task_serializer="json", accept_content=["json"], result_accept_content=["json"])
            # Read only when a URL is a sentinel:// list: the name of the primary its Sentinels watch.
            app.conf.update(
                broker_transport_options={"master_name": sentinel_master},
                result_backend_transport_options={"master_name": sentinel_master},
            )
        self.app = app

    def call(self, task: str, **kwargs: Any) -> Any:
        # Flower and worker logs show kwargsrepr: payloads may carry credentials, so they are hidden.
        # A call nobody answers in time expires with it: a worker that appears later drops it
        # instead of triggering a run the caller was told failed.
        result = self.app.send_task(
            task,
            kwargs=kwargs,
            queue=SERVICE_QUEUE,
            kwargsrepr=repr(redact(kwargs)),
            expires=self._expiry(),
            headers={SOURCE_HEADER: self.source},
        )
        try:
            return answer(result, self.timeout_s)
        finally:
            result.forget()

    def _expiry(self) -> datetime | float:
        """When a call sent now expires, by Redis's clock: chordbeat's workers judge expiry by it,
        and this host's clock may be off by more than the timeout (every call would be dropped as
        expired, or kept long after the caller gave up). Redis unreadable: relative to this host's
        clock, as plain Celery does. After a jump of Redis's clock the workers' time is Redis's
        minus the deployment's correction, read in the same round trip."""
        try:
            with (
                self.app.pool.acquire(block=True) as connection,
                connection.default_channel.client.pipeline(transaction=False) as pipe,
            ):
                (seconds_, microseconds), stored = pipe.time().get(CORRECTION_KEY).execute()
        except Exception:
            return self.timeout_s
        now_s = float(seconds_) + microseconds / 1_000_000
        if stored is not None:
            with contextlib.suppress(BadCorrection):  # garbled: the workers log it and keep their own
                now_s = Correction.from_text(stored).corrected(now_s)
        return datetime.fromtimestamp(now_s + self.timeout_s, UTC)

    def worker_listening(self, timeout_s: float = DEFAULT_PROBE_S) -> bool:
        """Whether some worker consumes the service queue, asked over Celery's remote control.

        The first such worker's answer ends the wait; ``timeout_s`` without an answer means none
        (a worker with remote control disabled counts as none). The question is asked again each
        second: a broadcast reaches only workers already listening, and one that just started
        listens a moment after it takes messages.
        """

        class Found(Exception):
            pass

        def check(reply: dict[str, Any]) -> None:
            for queues in reply.values():
                if any(isinstance(q, dict) and q.get("name") == SERVICE_QUEUE for q in queues or ()):
                    raise Found

        deadline = time.monotonic() + seconds("timeout_s", timeout_s)
        while (left := deadline - time.monotonic()) > 0:
            try:
                self.app.control.broadcast("active_queues", reply=True, timeout=min(1.0, left), callback=check)
            except Found:
                return True
        return False

    def apply_schedule(self, definition: Json, actor: str | None = None, reason: str | None = None) -> ScheduleJson:
        return self.call(  # type: ignore[no-any-return]
            "chordbeat.apply_schedule", definition=definition, **_who(actor, reason)
        )

    def delete_schedule(self, name: str, actor: str | None = None, reason: str | None = None) -> DeletedJson:
        return self.call("chordbeat.delete_schedule", name=name, **_who(actor, reason))  # type: ignore[no-any-return]

    def get_schedule(self, name: str) -> ScheduleJson:
        return self.call("chordbeat.get_schedule", name=name)  # type: ignore[no-any-return]

    def list_schedules(self, limit: int = 500, after_name: str | None = None) -> list[ScheduleJson]:
        """One page, by name; :func:`each_schedule` follows the cursor through all of them."""
        return self.call("chordbeat.list_schedules", limit=limit, after_name=after_name)  # type: ignore[no-any-return]

    def pause_schedule(self, name: str, actor: str | None = None, reason: str | None = None) -> ScheduleJson:
        return self.call("chordbeat.pause_schedule", name=name, **_who(actor, reason))  # type: ignore[no-any-return]

    def resume_schedule(self, name: str, actor: str | None = None, reason: str | None = None) -> ScheduleJson:
        return self.call("chordbeat.resume_schedule", name=name, **_who(actor, reason))  # type: ignore[no-any-return]

    def trigger_schedule(
        self, name: str, payload: Json | None = None, actor: str | None = None, reason: str | None = None
    ) -> TriggerJson:
        return self.call(  # type: ignore[no-any-return]
            "chordbeat.trigger_schedule", name=name, payload=payload, **_who(actor, reason)
        )

    def cancel_execution(self, execution_id: int, actor: str | None = None, reason: str | None = None) -> ExecutionJson:
        return self.call(  # type: ignore[no-any-return]
            "chordbeat.cancel_execution", execution_id=execution_id, **_who(actor, reason)
        )

    def rerun_execution(
        self,
        execution_id: int,
        from_failed: bool = True,
        actor: str | None = None,
        reason: str | None = None,
        payload: dict[str, Any] | None = None,
        latest: bool = False,
    ) -> ExecutionJson:
        """A new run of a failed or cancelled one, from its first failed group (or all of it), with
        its payload or ``payload`` instead; its own definition version's steps, or with ``latest``
        the current definition's."""
        extra: dict[str, Any] = {} if payload is None else {"payload": payload}
        if latest:
            extra["latest"] = True
        return self.call(  # type: ignore[no-any-return]
            "chordbeat.rerun_execution",
            execution_id=execution_id,
            from_failed=from_failed,
            **_who(actor, reason),
            **extra,
        )

    def list_audit(
        self,
        schedule: str | None = None,
        limit: int = 50,
        execution_id: int | None = None,
        actor: str | None = None,
        action: str | None = None,
        since: str | None = None,
        until: str | None = None,
        before_id: int | None = None,
    ) -> list[AuditJson]:
        """Who did what, newest first (one schedule's rows, or all; filters left ``None`` send nothing)."""
        filters = {
            "execution_id": execution_id,
            "actor": actor,
            "action": action,
            "since": since,
            "until": until,
            "before_id": before_id,
        }
        given = {key: value for key, value in filters.items() if value is not None}
        return self.call("chordbeat.list_audit", schedule=schedule, limit=limit, **given)  # type: ignore[no-any-return]

    def get_execution(self, execution_id: int) -> ExecutionJson:
        return self.call("chordbeat.get_execution", execution_id=execution_id)  # type: ignore[no-any-return]

    def list_executions(
        self,
        schedule: str | None = None,
        status: str | None = None,
        limit: int = 50,
        before_id: int | None = None,
        version: int | None = None,
    ) -> list[ExecutionSummaryJson]:
        """One page of summaries, newest first; :func:`each_execution` follows the cursor."""
        extra = {} if version is None else {"version": version}
        return self.call(  # type: ignore[no-any-return]
            "chordbeat.list_executions", schedule=schedule, status=status, limit=limit, before_id=before_id, **extra
        )

    def list_slots(self, name: str, limit: int = 50) -> list[SlotJson]:
        return self.call("chordbeat.list_slots", name=name, limit=limit)  # type: ignore[no-any-return]

    def next_fires(self, name: str, count: int = 10) -> list[dict[str, Any]]:
        """The coming slots: ``[{"at", "local", "excluded"}]`` (``excluded``: why it will not run, or None)."""
        return self.call("chordbeat.next_fires", name=name, count=count)  # type: ignore[no-any-return]

    def list_versions(self, name: str, limit: int = 50, before: int | None = None) -> list[dict[str, Any]]:
        """The schedule's definition versions, newest first; ``before``: only older ones."""
        extra = {} if before is None else {"before": before}
        return self.call("chordbeat.list_versions", name=name, limit=limit, **extra)  # type: ignore[no-any-return]

    def get_version(self, name: str, version: int) -> dict[str, Any]:
        return self.call("chordbeat.get_version", name=name, version=version)  # type: ignore[no-any-return]

    def diff_versions(self, name: str, a: int, b: int) -> list[dict[str, Any]]:
        """``[{"path", "op", "old", "new"}]`` from version ``a`` to ``b``."""
        return self.call("chordbeat.diff_versions", name=name, a=a, b=b)  # type: ignore[no-any-return]

    def rollback_schedule(
        self, name: str, version: int, actor: str | None = None, reason: str | None = None
    ) -> ScheduleJson:
        """The schedule at a new version equal in content to ``version``."""
        return self.call(  # type: ignore[no-any-return]
            "chordbeat.rollback_schedule", name=name, version=version, **_who(actor, reason)
        )

    def backfill_schedule(
        self,
        name: str,
        start: str,
        end: str,
        mode: str = "missing",
        max_concurrent: int = 1,
        dry_run: bool = False,
        actor: str | None = None,
        reason: str | None = None,
        version: int | None = None,
    ) -> BackfillAnswerJson:
        """Run the slots ``start ≤ slot < end`` (ISO 8601 with offsets) that ``mode`` picks, oldest
        first, ``max_concurrent`` at a time, with definition ``version`` (the current one when not
        given); ``dry_run``: only list them."""
        extra = {} if version is None else {"version": version}
        return self.call(  # type: ignore[no-any-return]
            "chordbeat.backfill_schedule",
            name=name,
            start=start,
            end=end,
            mode=mode,
            max_concurrent=max_concurrent,
            dry_run=dry_run,
            **_who(actor, reason),
            **extra,
        )

    def cancel_backfill(self, backfill_id: int, actor: str | None = None, reason: str | None = None) -> BackfillJson:
        """The backfill's slots not started never start; its runs in progress go on."""
        return self.call(  # type: ignore[no-any-return]
            "chordbeat.cancel_backfill", backfill_id=backfill_id, **_who(actor, reason)
        )

    def get_backfill(self, backfill_id: int) -> BackfillJson:
        return self.call("chordbeat.get_backfill", backfill_id=backfill_id)  # type: ignore[no-any-return]

    def list_backfills(self, name: str, limit: int = 20) -> list[BackfillJson]:
        """The schedule's backfills and catch-ups, newest first."""
        return self.call("chordbeat.list_backfills", name=name, limit=limit)  # type: ignore[no-any-return]

    def list_alerts(self, schedule: str | None = None, status: str | None = None, limit: int = 50) -> list[AlertJson]:
        """Alerts, newest first; ``status``: ``open``, ``acknowledged``, ``silenced`` or ``all``."""
        return self.call(  # type: ignore[no-any-return]
            "chordbeat.list_alerts", schedule=schedule, status=status, limit=limit
        )

    def get_alert(self, id: str) -> AlertJson:
        return self.call("chordbeat.get_alert", id=id)  # type: ignore[no-any-return]

    def acknowledge_alert(self, id: str, actor: str | None = None, reason: str | None = None) -> AlertJson:
        return self.call("chordbeat.acknowledge_alert", id=id, **_who(actor, reason))  # type: ignore[no-any-return]

    def silence_schedule(
        self, name: str, until: str, reason: str | None = None, actor: str | None = None
    ) -> SilenceJson:
        """No alert of the schedule is sent until ``until`` (ISO 8601 with its offset)."""
        return self.call(  # type: ignore[no-any-return]
            "chordbeat.silence_schedule", name=name, until=until, **_who(actor, reason)
        )

    def unsilence_schedule(self, name: str, actor: str | None = None, reason: str | None = None) -> SilenceJson:
        return self.call("chordbeat.unsilence_schedule", name=name, **_who(actor, reason))  # type: ignore[no-any-return]

    def test_alert(self, channel: str, actor: str | None = None, reason: str | None = None) -> AlertJson:
        """A ``test`` alert down one channel; :meth:`get_alert` follows its delivery."""
        return self.call("chordbeat.test_alert", channel=channel, **_who(actor, reason))  # type: ignore[no-any-return]

    def apply_limit(
        self,
        definition: dict[str, Any],
        actor: str | None = None,
        reason: str | None = None,
        expected_version: int | None = None,
    ) -> dict[str, Any]:
        """Create or change a shared limit (docs/limits.md); a resize never pre-empts holders.
        ``expected_version``: the ``version`` read (0: none existed); refused if it changed since."""
        versioned = {} if expected_version is None else {"expected_version": expected_version}
        return self.call(  # type: ignore[no-any-return]
            "chordbeat.apply_limit", definition=definition, **_who(actor, reason), **versioned
        )

    def list_limits(self) -> list[dict[str, Any]]:
        """Every limit with ``in_use`` and ``waiting``."""
        return self.call("chordbeat.list_limits")  # type: ignore[no-any-return]

    def get_limit(self, name: str) -> dict[str, Any]:
        """The limit with its holders, first waiters and the slots each key holds."""
        return self.call("chordbeat.get_limit", name=name)  # type: ignore[no-any-return]

    def delete_limit(
        self, name: str, force: bool = False, actor: str | None = None, reason: str | None = None
    ) -> dict[str, Any]:
        """Delete a limit; refused while held unless ``force``."""
        return self.call(  # type: ignore[no-any-return]
            "chordbeat.delete_limit", name=name, force=force, **_who(actor, reason)
        )

    def close(self) -> None:
        # Finalize finished results now, while the backend connection still works; left to
        # interpreter shutdown their finalizers fail noisily.
        gc.collect()
        self.app.close()

    def __enter__(self) -> ChordbeatClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _who(actor: str | None, reason: str | None) -> dict[str, str]:
    """The audit kwargs given (left out when not: an older worker's tasks do not take them)."""
    return {k: v for k, v in (("actor", actor), ("reason", reason)) if v is not None}


def each_schedule(client: ChordbeatClient, page: int = 500) -> Iterator[ScheduleJson]:
    """Every schedule, by name, read ``page`` at a time. A page of large definitions can be
    shorter than asked (its answer is bounded in bytes): only an empty page is the last."""
    after: str | None = None
    while schedules := client.list_schedules(limit=page, after_name=after):
        yield from schedules
        after = schedules[-1]["name"]


def each_execution(
    client: ChordbeatClient, schedule: str | None = None, status: str | None = None, page: int = 500
) -> Iterator[ExecutionSummaryJson]:
    """Every execution summary, newest first, read ``page`` at a time. Runs started meanwhile are
    newer than the cursor and not included; none is repeated or skipped."""
    before: int | None = None
    while True:
        executions = client.list_executions(schedule, status, limit=page, before_id=before)
        yield from executions
        if len(executions) < page:
            return
        before = executions[-1]["id"]
