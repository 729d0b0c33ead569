"""The dashboard's tornado application: pages, live fragments, actions, and the routes.

Reads go straight to the database (read-only transactions, in a thread pool so a slow query
never stalls other requests); actions call the same service functions the service tasks run.
Every page needs a login (web/login.py, web/sessions.py); actions need the admin role and a CSRF
token (tornado's xsrf cookie).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlencode

import tornado.httpserver
import tornado.ioloop
import tornado.web
from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError

from celeryapp.application import ChordbeatCelery
from celeryapp.domain.limits import MAX_ID, MAX_NAME_CHARS
from celeryapp.interfaces.time_words import time_control_words
from celeryapp.interfaces.web import queries
from celeryapp.interfaces.web.actions import ActionHandler
from celeryapp.interfaces.web.alerts_page import AlertActionHandler, AlertsHandler, open_alerts, silence_in_force
from celeryapp.interfaces.web.audit_page import AuditHandler
from celeryapp.interfaces.web.auth import WebUser, check_auth_config
from celeryapp.interfaces.web.backfill_page import MODES, BackfillActionHandler, BackfillForm, schedule_backfills
from celeryapp.interfaces.web.base import BaseHandler, WebContext
from celeryapp.interfaces.web.bounded_bodies import BoundedBodies
from celeryapp.interfaces.web.broker_state import PingAnswers, broker_state
from celeryapp.interfaces.web.duration_chart import chart, scale, summary
from celeryapp.interfaces.web.duration_trends import schedule_durations
from celeryapp.interfaces.web.health_lines import health_lines
from celeryapp.interfaces.web.limits_page import LimitHandler, LimitsHandler
from celeryapp.interfaces.web.login import LoginHandler, LogoutHandler
from celeryapp.interfaces.web.runs_page import RunsHandler
from celeryapp.interfaces.web.versions_page import (
    RECENT_VERSIONS,
    RollbackHandler,
    VersionDiffHandler,
    VersionsHandler,
    runs_by_version,
)
from celeryapp.monitoring.health import age_s
from celeryapp.scheduling.calendar_files import preview_exclusions
from models import ScheduleStep, utcnow

logger = logging.getLogger(__name__)
T = TypeVar("T")
HERE = os.path.dirname(__file__)


class AliveHandler(BaseHandler):
    """For probes: answers without a login and without touching anything."""

    def get(self) -> None:
        self.write("ok\n")


class SchedulesHandler(BaseHandler):
    def filters(self) -> tuple[str, str, int]:
        search = self.get_argument("q", "")[:200]
        status = self.get_argument("status", "")
        try:
            page = max(1, min(int(self.get_argument("page", "1")), 10_000))
        except ValueError:
            page = 1
        return search, status, page

    async def data(self) -> dict[str, Any]:
        search, status, page = self.filters()
        rows, total = await self.read(lambda s: queries.schedule_page(s, search=search, status=status, page=page))
        badges = await self.read(open_alerts, [row.schedule.name for row in rows])
        pages = max(1, -(-total // queries.PAGE_SIZE))
        query = urlencode({"q": search, "status": status, "page": page})
        return {
            "rows": rows,
            "total": total,
            "page": page,
            "pages": pages,
            "search": search,
            "status": status,
            "query": query,
            "open_alerts": badges,
        }

    @tornado.web.authenticated
    async def get(self, fragment: str | None = None) -> None:
        data = await self.data()
        if fragment:
            self.render("_schedules_table.html", user=self.user, **data)
        else:
            self.page("schedules.html", **data)


class ScheduleHandler(BaseHandler):
    @tornado.web.authenticated
    async def get(self, fragment: str | None = None) -> None:
        name = self.get_argument("name")
        # No stored name is longer or holds NUL (which PostgreSQL refuses outright).
        if len(name) > MAX_NAME_CHARS or "\x00" in name:
            raise tornado.web.HTTPError(404, reason="no such schedule")
        view = await self.read(queries.schedule_view, name, utcnow(), not fragment)
        if view is None:
            raise tornado.web.HTTPError(404, reason="no such schedule")
        backfills = await self.read(schedule_backfills, name)
        if fragment:
            self.render("_schedule_live.html", v=view, user=self.user, backfills=backfills)
        else:
            badges = await self.read(open_alerts, [name])
            durations = await self.read(schedule_durations, view.schedule.id)
            silence = await self.read(silence_in_force, name, utcnow())
            s, directory = view.schedule, self.ctx.app.settings.calendars_dir
            by_version = await self.read(runs_by_version, name, s.version - RECENT_VERSIONS + 1)
            excluded = preview_exclusions(directory, s.calendar, s.timezone, s.dst, view.upcoming)
            self.page(
                "schedule.html",
                v=view,
                open_alerts=badges,
                silence=silence,
                excluded=excluded,
                backfills=backfills,
                f=BackfillForm(name),
                duration_chart=chart(durations),
                duration_summary=summary(durations),
                duration_scale=scale(durations),
                by_version=sorted(by_version.items(), reverse=True),
                modes=MODES,
                time_control=time_control_words(
                    {"catchup": s.catchup, "calendar": s.calendar, "dst": s.dst, "cron": s.cron}
                ),
            )


class ExecutionHandler(BaseHandler):
    @tornado.web.authenticated
    async def get(self, execution_id: str, fragment: str | None = None) -> None:
        if int(execution_id) > MAX_ID:  # beyond the id column: PostgreSQL would refuse the query
            raise tornado.web.HTTPError(404, reason="no such execution")
        view = await self.read(queries.execution_view, int(execution_id), utcnow())
        if view is None:
            raise tornado.web.HTTPError(404, reason="no such execution")
        if fragment == "step":
            name = self.get_argument("step")
            line = next((line for line in view.lines if line.name == name), None)
            if line is None:
                raise tornado.web.HTTPError(404, reason="no such step in this execution")
            self.render("_step_detail.html", v=view, line=line, user=self.user)
        elif fragment:
            self.render("_execution_live.html", v=view, user=self.user)
        else:
            self.page("execution.html", v=view)


class HealthHandler(BaseHandler):
    async def read_or_none(self, fn: Callable[..., T], *args: Any) -> T | None:
        """A read whose database may be down: the page shows the rest (the database's line says why)."""
        try:
            return await self.read(fn, *args)
        except SQLAlchemyError as exc:
            logger.warning("health page: the database does not answer: %s", exc)
            return None

    @tornado.web.authenticated
    async def get(self, fragment: str | None = None) -> None:
        now = utcnow()
        app = self.ctx.app
        loop = asyncio.get_running_loop()
        queues = await self.read_or_none(
            lambda s: [q for q in s.scalars(select(ScheduleStep.queue).distinct()).all() if q]
        )
        # The workers' ping takes its whole timeout: the database is read meanwhile.
        view, state = await asyncio.gather(
            self.read_or_none(queries.health_view, now),
            loop.run_in_executor(None, broker_state, app, queues or [], self.ctx.pings),
        )
        pings = state.pings or PingAnswers([], state.error, time.monotonic())
        lines = await loop.run_in_executor(None, health_lines, app, pings)
        beat_file = age_s(app.settings, "beat")
        args = {"v": view, "b": state, "beat_file_age": beat_file, "lines": lines, "monotonic": time.monotonic()}
        if fragment:
            self.render("_health_live.html", user=self.user, **args)
        else:
            self.page("health.html", **args)


def make_app(app: ChordbeatCelery, users: dict[str, WebUser], secret: str) -> tornado.web.Application:
    ctx = {"ctx": WebContext(app, users, secret)}
    return tornado.web.Application(
        [
            (r"/login", LoginHandler, ctx),
            (r"/logout", LogoutHandler, ctx),
            (r"/healthz", AliveHandler, ctx),
            (r"/", SchedulesHandler, ctx),
            (r"/schedules/(fragment)", SchedulesHandler, ctx),
            (r"/schedule", ScheduleHandler, ctx),
            (r"/schedule/(fragment)", ScheduleHandler, ctx),
            (r"/schedule/versions", VersionsHandler, ctx),
            (r"/schedule/diff", VersionDiffHandler, ctx),
            (r"/schedule/rollback", RollbackHandler, ctx),
            (r"/execution/([0-9]{1,12})", ExecutionHandler, ctx),
            (r"/execution/([0-9]{1,12})/(fragment|step)", ExecutionHandler, ctx),
            (r"/health", HealthHandler, ctx),
            (r"/health/(fragment)", HealthHandler, ctx),
            (r"/act/(run|pause|resume)", ActionHandler, ctx),
            (r"/act/(cancel|rerun)/([0-9]{1,12})", ActionHandler, ctx),
            (r"/act/(backfill)", BackfillActionHandler, ctx),
            (r"/act/(cancel-backfill)/([0-9]{1,12})", BackfillActionHandler, ctx),
            (r"/alerts", AlertsHandler, ctx),
            (r"/audit", AuditHandler, ctx),
            (r"/runs", RunsHandler, ctx),
            (r"/runs/(fragment|trends)", RunsHandler, ctx),
            (r"/alerts/(acknowledge|silence|unsilence)", AlertActionHandler, ctx),
            (r"/limits", LimitsHandler, ctx),
            (r"/limit", LimitHandler, ctx),
        ],
        template_path=os.path.join(HERE, "templates"),
        # With a static_path, Tornado serves /favicon.ico (which browsers ask for, whatever the page
        # links: a 404 in the log each time, before) and /robots.txt from it, without a login.
        static_path=os.path.join(HERE, "static"),
        cookie_secret=secret,
        xsrf_cookies=True,
        xsrf_cookie_kwargs={"httponly": True, "samesite": "Strict"},
        login_url="/login",
        autoescape="xhtml_escape",
        compress_response=True,
    )


def serve(app: ChordbeatCelery) -> None:
    """Run the dashboard until interrupted; refuses to start without accounts and a secret."""

    settings = app.settings
    users = check_auth_config(settings.web_users, settings.web_secret)
    web = make_app(app, users, settings.web_secret)
    limit = settings.web_max_body_bytes
    server = tornado.httpserver.HTTPServer(BoundedBodies(web, limit), xheaders=False, max_body_size=limit)
    server.listen(settings.web_port, address=settings.web_address)
    tornado.ioloop.IOLoop.current().start()
