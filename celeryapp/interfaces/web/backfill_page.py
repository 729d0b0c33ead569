"""The dashboard's backfills: the schedule page's Backfill form leads to a dry-run page listing the
slots the range holds (nothing changes: a GET), whose confirm button (a POST with a reason, as Run
now's page) starts them as the logged-in user with the source ``web``; the schedule page's live
part shows each backfill's and catch-up's progress, with a Cancel button that asks first (a
confirmation page, reason required as for cancelling a run). Admins only, as the other actions.

The form's times are the schedule's wall time, typed as ``2026-11-20 02:00`` (24-hour text fields,
not ``datetime-local``, which browsers show in their own 12-hour locale), unless they carry an
offset of their own (ISO 8601 typed or pasted); the CLI's ``--from``/``--to`` read the same.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import quote

import tornado.web
from sqlalchemy import select
from sqlalchemy.orm import Session

from celeryapp.domain.limits import MAX_ID, MAX_NAME_CHARS
from celeryapp.domain.times import parse_time
from celeryapp.errors import ChordbeatError, InvalidArgument
from celeryapp.interfaces.backfill_service import backfill_schedule, cancel_backfill
from celeryapp.interfaces.objects import backfill_json
from celeryapp.interfaces.objects import schedule_backfills as backfill_summaries
from celeryapp.interfaces.time_words import backfill_title, progress_words, zone_of
from celeryapp.interfaces.web.actions import Confirmation
from celeryapp.interfaces.web.base import FLASH_COOKIE, BaseHandler
from celeryapp.interfaces.web.redirects import same_site_path
from celeryapp.states import AuditSource
from models import Schedule

logger = logging.getLogger(__name__)

#: Backfills (and catch-ups) the schedule page shows, newest first.
PANEL_BACKFILLS = 5
#: Slots the dry-run page lists before it says how many more there are.
SLOTS_LISTED = 20
#: Longest text a form field may hold (an ISO time is 35 characters; the service refuses over 40).
MAX_FIELD_CHARS = 64
MODES = ("missing", "failed", "all")


@dataclass
class BackfillForm:
    """What the form asks, as typed (the dry-run page shows it again, to correct)."""

    name: str
    start: str = ""
    end: str = ""
    mode: str = "missing"
    max_concurrent: str = "1"
    reason: str = ""


@dataclass
class DryRun:
    """The dry-run page: the form, the schedule's zone, and the slots the range holds (or why not)."""

    form: BackfillForm
    zone: str
    slots: list[datetime] = field(default_factory=list)
    count: int = 0
    error: str | None = None
    back: str = "/"
    #: The schedule's status: a paused one's backfill starts when it is resumed.
    status: str = "active"
    #: Why the range holds no slot to run (the service's words, the range in the schedule's zone).
    none_because: str | None = None

    @property
    def more(self) -> int:
        return self.count - len(self.slots)


def schedule_backfills(session: Session, name: str) -> list[dict[str, Any]]:
    """The schedule's last backfills and catch-ups, newest first, with their progress."""
    return backfill_summaries(session, name, PANEL_BACKFILLS)


def form_time(field_name: str, text: str, zone: str) -> str:
    """A form's time as the service takes it: with its own offset as typed, else the schedule's
    wall time (``2026-11-20 02:00``, 24-hour)."""
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise InvalidArgument(
            field_name, f"is not a date and time (2026-11-20 02:00, 24-hour, or ISO 8601), got {text!r}"
        ) from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=zone_of(zone))).isoformat()


def _concurrent(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise InvalidArgument("max_concurrent", f"must be a whole number from 1 to 100, got {text!r}") from None


class BackfillActionHandler(BaseHandler):
    """``/act/backfill``: GET the dry-run page, POST start; ``/act/cancel-backfill/ID``: GET the
    confirmation page, POST cancel."""

    def admin(self) -> None:
        if not self.user.may_act:
            raise tornado.web.HTTPError(403, reason="read-only users cannot act")

    def form(self, get: Any) -> BackfillForm:
        name = get("name", "")
        if not name or len(name) > MAX_NAME_CHARS or "\x00" in name:
            raise tornado.web.HTTPError(404, reason="no such schedule")
        fields = {key: get(key, default)[:MAX_FIELD_CHARS] for key, default in (("from", ""), ("to", ""))}
        return BackfillForm(
            name,
            fields["from"],
            fields["to"],
            get("mode", "missing")[:MAX_FIELD_CHARS],
            get("max_concurrent", "1")[:MAX_FIELD_CHARS],
            get("reason", "")[:500],
        )

    def request_of(self, form: BackfillForm, zone: str) -> dict[str, Any]:
        return {
            "start": form_time("start", form.start, zone),
            "end": form_time("end", form.end, zone),
            "mode": form.mode,
            "max_concurrent": _concurrent(form.max_concurrent),
        }

    async def dry_run(self, form: BackfillForm) -> DryRun:
        found = await self.read(
            lambda s: s.execute(select(Schedule.timezone, Schedule.status).where(Schedule.name == form.name)).first()
        )
        if found is None:
            raise tornado.web.HTTPError(404, reason="no such schedule")
        zone, status = found
        page = DryRun(form, zone, back=f"/schedule?name={quote(form.name, safe='')}", status=status.value)
        if not form.start and not form.end:
            return page  # the form alone, nothing asked yet
        try:
            answer = await asyncio.get_running_loop().run_in_executor(
                None,
                functools.partial(
                    backfill_schedule, self.ctx.app, form.name, dry_run=True, **self.request_of(form, zone)
                ),
            )
        except ChordbeatError as exc:
            page.error = str(exc)
            return page
        page.count = answer["count"]
        page.none_because = answer.get("none_because")
        page.slots = [t for t in (parse_time(s) for s in answer["slots"][:SLOTS_LISTED]) if t is not None]
        return page

    @tornado.web.authenticated
    async def get(self, action: str, backfill_id: str | None = None) -> None:
        self.admin()
        if action == "cancel-backfill":
            c = await self.cancellation(backfill_id)
            c.back = same_site_path(self.get_query_argument("next", c.back), c.back)
            self.page("confirm.html", c=c)
            return
        page = await self.dry_run(self.form(self.get_query_argument))
        if page.error:
            self.set_status(400)
        self.page("backfill.html", d=page, modes=MODES)

    async def cancellation(self, backfill_id: str | None) -> Confirmation:
        if backfill_id is None or int(backfill_id) > MAX_ID:
            raise tornado.web.HTTPError(404, reason="no such backfill")
        view = await self.read(lambda s: backfill_json(s, int(backfill_id)))
        if view is None:
            raise tornado.web.HTTPError(404, reason="no such backfill")
        waiting = view["total"] - view["started"]
        state = "" if view["status"] == "running" else f" It is {view['status']} already: nothing is left to cancel."
        return Confirmation(
            "cancel",
            f"Cancel backfill #{view['id']}",
            f"cancel backfill #{view['id']} of {view['schedule']} ({progress_words(view)})",
            f"Its {waiting} slots not started never start; its runs in progress go on (cancel each on its page)."
            + state,
            "Cancel this backfill",
            f"/act/cancel-backfill/{view['id']}",
            name=view["schedule"],
            back=f"/schedule?name={quote(view['schedule'], safe='')}",
        )

    @tornado.web.authenticated
    async def post(self, action: str, backfill_id: str | None = None) -> None:
        self.admin()
        reason = self.get_body_argument("reason", "").strip() or None
        if action == "cancel-backfill":
            await self.cancel(backfill_id, reason)
            return
        form = self.form(self.get_body_argument)
        page = await self.dry_run(BackfillForm(form.name))  # the schedule's zone; 404 when it is gone
        try:
            message = await asyncio.get_running_loop().run_in_executor(
                None, functools.partial(self.start, form, page.zone, reason)
            )
        except ChordbeatError as exc:
            # The same page, what was typed kept, and what is wrong (the range may hold other slots now).
            page = await self.dry_run(form)
            page.error = page.error or str(exc)
            self.set_status(400)
            self.page("backfill.html", d=page, modes=MODES)
            return
        logger.info("web: backfill by %s: %s", self.user.name, message)
        self.set_signed_cookie(FLASH_COOKIE, message, expires_days=None, httponly=True, samesite="Strict")
        self.redirect(page.back)

    def start(self, form: BackfillForm, zone: str, reason: str | None) -> str:
        who: dict[str, Any] = {"actor": self.user.name, "reason": reason, "source": AuditSource.WEB}
        started = backfill_schedule(self.ctx.app, form.name, **self.request_of(form, zone), **who)
        if started["backfill_id"] is None:
            return f"{form.name}: nothing to backfill: no slot of that range is {form.mode}"
        return f"{form.name}: backfill #{started['backfill_id']} started: {started['count']} slots, oldest first"

    async def cancel(self, backfill_id: str | None, reason: str | None) -> None:
        c = await self.cancellation(backfill_id)
        back = same_site_path(self.get_body_argument("next", c.back), c.back)
        if reason is None:
            c.back, c.error = back, "Say why: a reason is required to cancel."
            self.set_status(400)
            self.page("confirm.html", c=c)
            return
        assert backfill_id is not None
        try:
            view = await asyncio.get_running_loop().run_in_executor(
                None,
                functools.partial(
                    cancel_backfill,
                    self.ctx.app,
                    int(backfill_id),
                    actor=self.user.name,
                    reason=reason,
                    source=AuditSource.WEB,
                ),
            )
            message = f"backfill {backfill_title(view)} ({progress_words(view)})"
        except ChordbeatError as exc:
            message = f"cancel refused: {exc}"
        logger.info("web: cancel backfill by %s: %s", self.user.name, message)
        self.set_signed_cookie(FLASH_COOKIE, message, expires_days=None, httponly=True, samesite="Strict")
        self.redirect(back)
