"""The dashboard's alerts: the ``/alerts`` page (what was raised, where it went, who is on it),
the open-alert badges of the schedule pages, and acknowledging an alert or silencing a schedule's
alerts, each after a confirmation page that asks why (as Pause does). Ending a silence acts at
once, like Resume: it stops nothing anyone waits for. Admins only, as the other actions.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

import tornado.web
from sqlalchemy import select
from sqlalchemy.orm import Session
from tornado.escape import xhtml_escape

from celeryapp.domain.deadlines import finish_by_after, wall_time
from celeryapp.domain.limits import MAX_NAME_CHARS
from celeryapp.domain.times import iso
from celeryapp.errors import ChordbeatError, InvalidArgument
from celeryapp.interfaces import alerts
from celeryapp.interfaces.display import alert_words, deadline_words
from celeryapp.interfaces.time_words import stamp
from celeryapp.interfaces.web.actions import Confirmation
from celeryapp.interfaces.web.base import FLASH_COOKIE, BaseHandler
from celeryapp.interfaces.web.humanize import here_tag
from celeryapp.interfaces.web.redirects import same_site_path
from celeryapp.states import AuditSource
from models import Alert, AlertSilence, Schedule, utcnow
from models.alert_tables import ALERT_KEY_LENGTH

logger = logging.getLogger(__name__)

#: Alerts one page shows.
PAGE_ALERTS = 100
#: How long a silence from the dashboard lasts: (form value in hours, words).
SILENCE_HOURS = ((1, "1 hour"), (4, "4 hours"), (12, "12 hours"), (24, "1 day"), (72, "3 days"), (168, "1 week"))
#: Statuses the page filters on, in the order of its tabs.
TABS = ("open", "all", "acknowledged", "silenced")


@dataclass
class AlertsView:
    alerts: list[dict[str, Any]]
    #: Each schedule's time zone (alerts' times are shown in it); test alerts have none: UTC.
    zones: dict[str, str]
    #: Silences in force, latest ending first.
    silences: list[AlertSilence] = field(default_factory=list)


def alerts_view(session: Session, schedule: str | None, status: str, now: datetime) -> AlertsView:
    rows = alerts.alert_rows(session, schedule=schedule, status=status, limit=PAGE_ALERTS)
    in_force = select(AlertSilence).where(AlertSilence.until > now).order_by(AlertSilence.until.desc())
    if schedule is not None:
        in_force = in_force.where(AlertSilence.schedule_name == schedule)
    silences = list(session.scalars(in_force))
    names = {r.schedule_name for r in rows if r.schedule_name} | {q.schedule_name for q in silences}
    zones = dict(session.execute(select(Schedule.name, Schedule.timezone).where(Schedule.name.in_(names))).all())
    return AlertsView(alerts.alerts_json(session, rows), zones, silences)


def open_alerts(session: Session, names: list[str]) -> dict[str, int]:
    """The badges: how many open alerts each schedule has."""
    return alerts.open_counts(session, names)


def silence_in_force(session: Session, name: str, now: datetime) -> AlertSilence | None:
    return alerts.silence_of(session, name, now)


def duties(schedule: Schedule, now: datetime) -> str:
    """A schedule's deadlines and alerts in words, as markup (escaped here): the next ``finish_by``
    carries the browser's "here" time, as an instant does; empty when it has neither."""
    said = []
    if deadlines := deadline_words(schedule.deadlines, schedule.timezone):
        said.append(f"Deadlines: {xhtml_escape(deadlines)}")
        if finish_by := (schedule.deadlines or {}).get("finish_by"):
            said[-1] += here_tag(finish_by_after(now, wall_time(finish_by), schedule.timezone), schedule.timezone)
    if words := alert_words(schedule.alerts):
        said.append(f"Alerts on {xhtml_escape(words)}")
    elif deadlines:
        said.append("No alerts: a deadline passing is recorded, nobody is told")
    return " · ".join(said)


class AlertsHandler(BaseHandler):
    @tornado.web.authenticated
    async def get(self) -> None:
        status = self.get_argument("status", "open")
        if status not in TABS:
            status = "open"
        schedule = self.get_argument("schedule", "")[:MAX_NAME_CHARS].replace("\x00", "") or None
        view = await self.read(alerts_view, schedule, status, utcnow())
        self.page("alerts.html", v=view, status=status, schedule=schedule, tabs=TABS)


def _for_alert(session: Session, key: str) -> Confirmation | None:
    alert = session.scalar(select(Alert).where(Alert.key == key))
    if alert is None:
        return None
    about = alert.schedule_name or "no schedule"
    done = f" It was acknowledged by {alert.acknowledged_by} already." if alert.acknowledged_by else ""
    return Confirmation(
        "acknowledge",
        "Acknowledge alert",
        f"acknowledge the {alert.kind.value} alert of {about}: {alert.message[:300]}",
        "It says you are on it: the alert leaves the open list and the badges; deliveries still due go on." + done,
        "Acknowledge",
        "/alerts/acknowledge",
        alert_id=key,
        back="/alerts",
    )


def _for_silence(session: Session, name: str, now: datetime) -> Confirmation | None:
    zone = session.scalar(select(Schedule.timezone).where(Schedule.name == name))
    if zone is None:
        return None
    current = alerts.silence_of(session, name, now)
    replaced = f" It replaces the silence until {stamp(current.until, zone, None, now)}." if current else ""
    return Confirmation(
        "silence",
        f"Silence {name}'s alerts",
        f"send no alert of {name} for the time chosen below",
        "Its alerts are still raised, kept and listed here (marked silenced), but no channel gets them; "
        "they are not sent later either." + replaced,
        "Silence",
        "/alerts/silence",
        name=name,
        back=f"/schedule?name={quote(name, safe='')}",
        durations=SILENCE_HOURS,
    )


class AlertActionHandler(BaseHandler):
    """GET: the confirmation page (acknowledge, silence); POST: the action (unsilence at once)."""

    def admin(self) -> None:
        if not self.user.may_act:
            raise tornado.web.HTTPError(403, reason="read-only users cannot act")

    async def confirmation(self, action: str, key: str | None, name: str | None) -> Confirmation:
        found: Confirmation | None = None
        if action == "acknowledge" and key is not None and len(key) <= ALERT_KEY_LENGTH and "\x00" not in key:
            found = await self.read(_for_alert, key)
        elif action == "silence" and name is not None and len(name) <= MAX_NAME_CHARS and "\x00" not in name:
            found = await self.read(_for_silence, name, utcnow())
        if found is None:
            raise tornado.web.HTTPError(404, reason="no such alert" if action == "acknowledge" else "no such schedule")
        return found

    @tornado.web.authenticated
    async def get(self, action: str) -> None:
        self.admin()
        if action == "unsilence":
            raise tornado.web.HTTPError(405)
        c = await self.confirmation(action, self.get_query_argument("id", None), self.get_query_argument("name", None))
        c.back = same_site_path(self.get_query_argument("next", c.back), c.back)
        self.page("confirm.html", c=c)

    @tornado.web.authenticated
    async def post(self, action: str) -> None:
        self.admin()
        key, name = self.get_body_argument("id", None), self.get_body_argument("name", None)
        reason = self.get_body_argument("reason", "").strip() or None
        hours = self.get_body_argument("hours", "")
        try:
            if action != "unsilence" and reason is None:
                raise InvalidArgument("reason", f"say why: a reason is required to {action}")
            message = await asyncio.get_running_loop().run_in_executor(
                None, functools.partial(self.act, action, key, name, reason, hours)
            )
        except InvalidArgument as exc:
            if action == "unsilence":
                message = f"{action} refused: {exc}"
            else:
                # The same page, what was typed kept, and what is wrong with it.
                c = await self.confirmation(action, key, name)
                c.back, c.reason, c.error = (
                    same_site_path(self.get_body_argument("next", c.back), c.back),
                    reason or "",
                    str(exc),
                )
                self.set_status(400)
                self.page("confirm.html", c=c)
                return
        except ChordbeatError as exc:
            message = f"{action} refused: {exc}"
        logger.info("web: %s by %s: %s", action, self.user.name, message)
        self.set_signed_cookie(FLASH_COOKIE, message, expires_days=None, httponly=True, samesite="Strict")
        self.redirect(same_site_path(self.get_body_argument("next", "/alerts"), "/alerts"))

    def act(self, action: str, key: str | None, name: str | None, reason: str | None, hours: str) -> str:
        app = self.ctx.app
        who: dict[str, Any] = {"actor": self.user.name, "reason": reason, "source": AuditSource.WEB}
        if action == "acknowledge":
            alert = alerts.acknowledge_alert(app, key or "", **who)
            return f"alert {alert['id']}: acknowledged by {alert['acknowledged_by']}"
        if action == "unsilence":
            ended = alerts.unsilence_schedule(app, name or "", **who)
            return f"{name}: {'alerts are sent again' if ended['changed'] else 'was not silenced'}"
        words = {str(h): w for h, w in SILENCE_HOURS}.get(hours)
        if words is None:
            raise InvalidArgument("hours", f"choose one of the lengths offered, got {hours[:20]!r}")
        until = iso(utcnow() + timedelta(hours=int(hours)))
        alerts.silence_schedule(app, name or "", until or "", **who)
        return f"{name}: alerts silenced for {words}"
