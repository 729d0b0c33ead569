"""The dashboard's definition versions (docs/versions.md): a schedule's versions, two of them side
by side field by field, and a rollback to one, which shows what will change and asks why first
(a plain GET, nothing changes) and acts on that page's POST as the logged-in user (source ``web``).
Every read and change goes through the service's operations, checked as they check them."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import tornado.web
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from celeryapp.errors import ChordbeatError, InvalidArgument, NotFound
from celeryapp.interfaces import service, version_service
from celeryapp.interfaces.web.base import FLASH_COOKIE, BaseHandler
from celeryapp.states import AuditSource
from models import ExecutionStatus, ScheduleExecution

logger = logging.getLogger(__name__)

T = TypeVar("T")
#: Versions one page lists, newest first (``before`` pages on).
PAGE_VERSIONS = 100


@dataclass(frozen=True)
class Side:
    """One row of a side-by-side diff: a field, its value in each version as JSON text (None: absent)."""

    path: str
    op: str
    old: str | None
    new: str | None


def sides(differences: list[dict[str, Any]]) -> list[Side]:
    def shown(value: Any, present: bool) -> str | None:
        return json.dumps(value, ensure_ascii=False, indent=1) if present else None

    return [
        Side(d["path"], d["op"], shown(d["old"], d["op"] != "added"), shown(d["new"], d["op"] != "removed"))
        for d in differences
    ]


#: Versions the schedule page counts failures of (the newest ones; the versions page has them all).
RECENT_VERSIONS = 5


@dataclass
class VersionRuns:
    """A version's kept runs, and how many of them failed (a failure rate by version)."""

    total: int = 0
    failed: int = 0

    def words(self) -> str:
        if not self.total:
            return "no runs"
        share = f" ({100 * self.failed / self.total:.0f} %)" if self.failed else ""
        return f"{self.total} run{'s' if self.total != 1 else ''}, {self.failed} failed{share}"


def runs_by_version(session: Session, name: str, since_version: int = 1) -> dict[int, VersionRuns]:
    """The schedule's kept runs of ``since_version`` and later, counted by version and outcome in
    one statement (its index on ``(schedule_name, version, id)``)."""
    counted: dict[int, VersionRuns] = {}
    query = (
        select(ScheduleExecution.version, ScheduleExecution.status, func.count())
        .where(ScheduleExecution.schedule_name == name, ScheduleExecution.version >= since_version)
        .group_by(ScheduleExecution.version, ScheduleExecution.status)
    )
    for version, status, count in session.execute(query):
        assert version is not None  # the query leaves out runs started before versions
        runs = counted.setdefault(version, VersionRuns())
        runs.total += count
        if status is ExecutionStatus.FAILED:
            runs.failed += count
    return counted


class VersionsBase(BaseHandler):
    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A service operation off the event loop: an unknown schedule or version is a 404, a
        refused argument a 400 naming it."""
        try:
            return await asyncio.get_running_loop().run_in_executor(
                None, functools.partial(fn, self.ctx.app, *args, **kwargs)
            )
        except NotFound as exc:
            raise tornado.web.HTTPError(404, reason=str(exc)) from None
        except InvalidArgument as exc:
            raise tornado.web.HTTPError(400, reason=str(exc)) from None

    def version_argument(self, name: str) -> int:
        text = self.get_query_argument(name)
        if not text.isdigit() or len(text) > 10:
            raise tornado.web.HTTPError(400, reason=f"{name}: must be a version number")
        return int(text)


class VersionsHandler(VersionsBase):
    """``/schedule/versions?name=``: the versions, newest first, each with its changes and its
    runs' failure rate."""

    @tornado.web.authenticated
    async def get(self) -> None:
        name = self.get_query_argument("name")
        schedule = await self.call(service.get_schedule, name)
        versions = await self.call(version_service.list_versions, name, PAGE_VERSIONS)
        runs = await self.read(runs_by_version, name)
        self.page("versions.html", s=schedule, versions=versions, runs=runs)


class VersionDiffHandler(VersionsBase):
    """``/schedule/diff?name=&a=&b=``: version ``a`` beside version ``b``, a row a field that differs."""

    @tornado.web.authenticated
    async def get(self) -> None:
        name, a, b = self.get_query_argument("name"), self.version_argument("a"), self.version_argument("b")
        schedule = await self.call(service.get_schedule, name)
        differences = await self.call(version_service.diff_versions, name, a, b)
        self.page("version_diff.html", s=schedule, a=a, b=b, rows=sides(differences), rollback=False, error=None)


class RollbackHandler(VersionsBase):
    """GET ``/schedule/rollback?name=&to=``: what the rollback changes (current beside ``to``) and
    the form; POST: the rollback."""

    def admin(self) -> None:
        if not self.user.may_act:
            raise tornado.web.HTTPError(403, reason="read-only users cannot act")

    async def confirmation(self, name: str, to: int, error: str | None = None) -> None:
        schedule = await self.call(service.get_schedule, name)
        differences = await self.call(version_service.diff_versions, name, schedule["version"], to)
        if error is not None:
            self.set_status(400)
        self.page(
            "version_diff.html",
            s=schedule,
            a=schedule["version"],
            b=to,
            rows=sides(differences),
            rollback=True,
            error=error,
        )

    @tornado.web.authenticated
    async def get(self) -> None:
        self.admin()
        await self.confirmation(self.get_query_argument("name"), self.version_argument("to"))

    @tornado.web.authenticated
    async def post(self) -> None:
        self.admin()
        name, to = self.get_body_argument("name"), self.get_body_argument("to")
        if not to.isdigit() or len(to) > 10:
            raise tornado.web.HTTPError(400, reason="to: must be a version number")
        reason = self.get_body_argument("reason", "").strip() or None
        try:
            schedule = await self.call(
                version_service.rollback_schedule,
                name,
                int(to),
                actor=self.user.name,
                reason=reason,
                source=AuditSource.WEB,
            )
        except tornado.web.HTTPError as exc:
            if exc.status_code != 400:
                raise
            await self.confirmation(name, int(to), exc.reason)
            return
        except ChordbeatError as exc:  # the old definition is refused as an apply would be
            await self.confirmation(name, int(to), f"rollback refused: {exc}")
            return
        message = f"{name}: version {schedule['version']} (the definition of version {to})"
        logger.info("web: rollback by %s: %s", self.user.name, message)
        self.set_signed_cookie(FLASH_COOKIE, message, expires_days=None, httponly=True, samesite="Strict")
        self.redirect(f"/schedule/versions?name={tornado.escape.url_escape(name, plus=False)}")
