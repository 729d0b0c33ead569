"""The dashboard's actions. Run now, Pause, Cancel and Re-run first show what will happen and ask
why (a confirmation page: a plain GET, no script, nothing changes), and act on that page's POST as
the logged-in user with the source ``web``, so the audit trail says who did it. Resume acts at
once: it undoes nothing anyone waits for. Admins only; tornado checks every POST's xsrf token
before a handler runs.

Run now's page holds the payload as JSON text, prefilled with the schedule's own: text that is not
JSON is shown again with the line and column of the mistake, and nothing starts.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import tornado.web
from sqlalchemy import select
from sqlalchemy.orm import Session

from celeryapp.domain.limits import MAX_ID
from celeryapp.domain.times import span
from celeryapp.errors import ChordbeatError, InvalidArgument
from celeryapp.execution.reruns import first_failed_group
from celeryapp.interfaces import service
from celeryapp.interfaces.web.base import FLASH_COOKIE, BaseHandler
from celeryapp.interfaces.web.redirects import same_site_path
from celeryapp.states import AuditSource
from models import ExecutionStatus, Schedule, ScheduleExecution, ScheduleStatus, utcnow

logger = logging.getLogger(__name__)

#: Actions that stop something people may be waiting for, or keep alerts from them: they must say why.
REASON_REQUIRED = frozenset({"pause", "cancel", "acknowledge", "silence"})
#: Actions that show a confirmation page first.
CONFIRMED = frozenset({"run", "pause", "cancel", "rerun"})
#: Runs that can be re-run.
RERUNNABLE = frozenset({ExecutionStatus.FAILED, ExecutionStatus.CANCELLED})


@dataclass
class Confirmation:
    """What a confirmation page says and where its form goes."""

    action: str
    title: str
    #: What will happen, in one line: ``cancel execution 41 of payroll-export, running 3 min``.
    what: str
    #: What follows from it, for the careful reader.
    consequence: str
    button: str
    target: str
    name: str | None = None
    execution_id: int | None = None
    #: Run now and re-run: the payload as JSON text.
    payload: str | None = None
    #: Whose payload is filled in: "the schedule's" or "the run's".
    payload_of: str = "the schedule's"
    back: str = "/"
    error: str | None = None
    reason: str = ""
    #: Acknowledge only: the alert's id.
    alert_id: str | None = None
    #: Silence only: the lengths to choose from, (hours, words).
    durations: tuple[tuple[int, str], ...] = ()

    @property
    def reason_required(self) -> bool:
        return self.action in REASON_REQUIRED


def _for_schedule(session: Session, action: str, name: str, now: datetime) -> Confirmation | None:
    schedule = session.scalar(select(Schedule).where(Schedule.name == name))
    if schedule is None:
        return None
    running = session.scalar(
        select(ScheduleExecution.id)
        .where(ScheduleExecution.schedule_id == schedule.id, ScheduleExecution.status == ExecutionStatus.IN_PROGRESS)
        .order_by(ScheduleExecution.id.desc())
        .limit(1)
    )
    busy = f" Execution #{running} is running: overlap {schedule.overlap.value} decides." if running else ""
    if action == "run":
        groups = len({s.step_index for s in schedule.steps})
        return Confirmation(
            action,
            f"Run {name} now",
            f"start a run of {name} now ({len(schedule.steps)} steps in {groups} groups)",
            "It starts as a manual run with the payload below; the schedule's own times do not change." + busy,
            "Run now",
            "/act/run",
            name=name,
            payload=json.dumps(schedule.payload or {}, indent=2, ensure_ascii=False),
        )
    if schedule.status is not ScheduleStatus.ACTIVE:
        return Confirmation(
            action,
            f"Pause {name}",
            f"pause {name}",
            f"It is {schedule.status.value}: only an active schedule can be paused.",
            "Pause",
            "/act/pause",
            name=name,
        )
    return Confirmation(
        action,
        f"Pause {name}",
        f"pause {name}",
        "No run starts until it is resumed; the due times meanwhile are recorded as skipped (paused)."
        + (f" Execution #{running} is running and carries on." if running else ""),
        "Pause",
        "/act/pause",
        name=name,
    )


def _for_execution(session: Session, action: str, execution_id: int, now: datetime) -> Confirmation | None:
    execution = session.get(ScheduleExecution, execution_id)
    if execution is None:
        return None
    name = execution.schedule_name
    if action == "cancel":
        state = (
            f"running {span((now - execution.started_at).total_seconds())}"
            if execution.status is ExecutionStatus.IN_PROGRESS
            else f"already {execution.status.value}"
        )
        return Confirmation(
            action,
            f"Cancel execution {execution_id}",
            f"cancel execution {execution_id} of {name}, {state}",
            "Its running steps are stopped and its waiting steps never start; the run ends as cancelled.",
            "Cancel this run",
            f"/act/cancel/{execution_id}",
            name=name,
            execution_id=execution_id,
            back=f"/execution/{execution_id}",
        )
    group = first_failed_group(execution)
    refusal = (
        ""
        if execution.status in RERUNNABLE
        else f" It is {execution.status.value}: only a failed or cancelled run can be re-run."
    )
    return Confirmation(
        action,
        f"Re-run execution {execution_id}",
        f"re-run execution {execution_id} of {name} from group {group + 1}",
        f"A new manual run with the same steps and the payload below starts at group {group + 1}; "
        f"the groups before it are taken from #{execution_id}." + refusal,
        f"Re-run from group {group + 1}",
        f"/act/rerun/{execution_id}",
        name=name,
        execution_id=execution_id,
        back=f"/execution/{execution_id}",
        payload=json.dumps(execution.payload or {}, indent=2, ensure_ascii=False),
        payload_of=f"run #{execution_id}'s",
    )


def parse_payload(text: str) -> dict[str, Any] | None:
    """The payload typed in the form: None for an empty field (the schedule's, or the re-run run's, own).

    Raises InvalidArgument with the line and column of the first mistake."""
    if not text.strip():
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgument("payload", f"not JSON: line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    if not isinstance(value, dict):
        raise InvalidArgument("payload", "must be a JSON object ({...})")
    return value


class ActionHandler(BaseHandler):
    """GET: the confirmation page; POST: the action."""

    def admin(self) -> None:
        if not self.user.may_act:
            raise tornado.web.HTTPError(403, reason="read-only users cannot act")

    async def confirmation(self, action: str, execution_id: str | None, name: str | None) -> Confirmation:
        now = utcnow()
        if execution_id is not None:
            if int(execution_id) > MAX_ID:
                raise tornado.web.HTTPError(404, reason="no such execution")
            found = await self.read(_for_execution, action, int(execution_id), now)
        else:
            found = None if name is None else await self.read(_for_schedule, action, name, now)
        if found is None:
            raise tornado.web.HTTPError(404, reason="no such schedule" if execution_id is None else "no such execution")
        return found

    @tornado.web.authenticated
    async def get(self, action: str, execution_id: str | None = None) -> None:
        self.admin()
        if action not in CONFIRMED:
            raise tornado.web.HTTPError(405)
        c = await self.confirmation(action, execution_id, self.get_query_argument("name", None))
        c.back = same_site_path(self.get_query_argument("next", c.back), c.back)
        self.page("confirm.html", c=c)

    async def again(self, action: str, execution_id: str | None, name: str | None, error: str) -> None:
        """The confirmation page once more, with what was typed and what is wrong with it."""
        c = await self.confirmation(action, execution_id, name)
        c.back = same_site_path(self.get_body_argument("next", c.back), c.back)
        c.reason = self.get_body_argument("reason", "")
        if c.payload is not None:
            c.payload = self.get_body_argument("payload", c.payload)
        c.error = error
        self.set_status(400)
        self.page("confirm.html", c=c)

    @tornado.web.authenticated
    async def post(self, action: str, execution_id: str | None = None) -> None:
        self.admin()
        name = None if execution_id is not None else self.get_body_argument("name")
        reason = self.get_body_argument("reason", "").strip() or None
        if action in REASON_REQUIRED and reason is None:
            await self.again(action, execution_id, name, f"Say why: a reason is required to {action}.")
            return
        try:
            typed = self.get_body_argument("payload", "") if action in ("run", "rerun") else ""
            message, target = await asyncio.get_running_loop().run_in_executor(
                None, functools.partial(self.act, action, execution_id, name, reason, typed)
            )
        except InvalidArgument as exc:
            if action in CONFIRMED:
                # What was typed (a reason, a payload) is wrong: the same page, the text kept.
                await self.again(action, execution_id, name, str(exc))
                return
            message, target = f"{action} refused: {exc}", None
        except ChordbeatError as exc:
            message, target = f"{action} refused: {exc}", None
        logger.info("web: %s by %s: %s", action, self.user.name, message)
        self.set_signed_cookie(FLASH_COOKIE, message, expires_days=None, httponly=True, samesite="Strict")
        self.redirect(target or same_site_path(self.get_body_argument("next", "/")))

    def act(
        self, action: str, execution_id: str | None, name: str | None, reason: str | None, typed: str
    ) -> tuple[str, str | None]:
        """Do it (off the event loop: a long payload takes a while to parse); answer the message to
        show and the page to show it on (None: back)."""
        app = self.ctx.app
        who: dict[str, Any] = {"actor": self.user.name, "reason": reason, "source": AuditSource.WEB}
        if execution_id is not None:
            run = int(execution_id)
            if action == "cancel":
                result = service.cancel_execution(app, run, **who)
                return f"execution {run}: {result['status']}", f"/execution/{run}"
            # The run's own payload is filled in: sent unchanged, the run row records no change.
            rerun = service.rerun_execution(app, run, True, payload=parse_payload(typed), **who)
            if rerun.get("id") is None:
                return f"re-run of #{run} not started: {rerun['skipped']}", None
            return f"execution {rerun['id']} started: re-run of #{run}", f"/execution/{rerun['id']}"
        assert name is not None
        if action == "run":
            started = service.trigger_schedule(app, name, parse_payload(typed), **who)
            if started.get("execution_id") is None:
                return f"{name}: not started: {started['skipped']}", None
            return f"{name}: execution {started['execution_id']} started", f"/execution/{started['execution_id']}"
        if action == "pause":
            return f"{name}: {service.pause_schedule(app, name, **who)['status']}", None
        return f"{name}: {service.resume_schedule(app, name, **who)['status']}", None
