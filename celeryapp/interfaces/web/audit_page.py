"""The dashboard's ``/audit`` page: every audit row, file applies (which name no schedule) and
logins among them, newest first, filtered by actor, action, schedule and time, paged by cursor.
The filters live in the query string, so a filtered page's address can be sent to someone else;
they are checked as ``list_audit`` checks them, and a refusal names the field on the page."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import tornado.web
from sqlalchemy import select
from sqlalchemy.orm import Session

from celeryapp.domain.limits import short_repr
from celeryapp.errors import InvalidArgument
from celeryapp.interfaces.arguments import name_arg
from celeryapp.interfaces.audit import AuditFilter, audit_filter, audit_rows
from celeryapp.interfaces.web.backfill_page import form_time
from celeryapp.interfaces.web.base import BaseHandler
from celeryapp.interfaces.web.since_choices import SINCE_CHOICES, since_time
from celeryapp.states import AuditAction
from models import Schedule, utcnow

#: Rows one page shows; a full page links to the next.
PAGE_ROWS = 50
#: Query-string values longer than this are cut before they are checked (each check refuses far less).
_ARGUMENT_CHARS = 300
#: The query-string names of the filters, in the order a shared address lists them: ``from`` and
#: ``to`` are the form's wall times in ``zone`` (the viewer's, which the browser fills in);
#: ``since`` and ``until`` instants (ISO 8601) or, for ``since``, one of the form's lengths.
FILTER_NAMES = ("actor", "action", "schedule", "since", "until", "from", "to", "zone")
ACTIONS = tuple(a.value for a in AuditAction)


@dataclass
class AuditView:
    rows: list[dict[str, Any]]
    #: Each schedule's time zone (a row's time is shown in it); rows of no schedule: UTC.
    zones: dict[str, str]
    #: The filters as given (for the form and the links), empty ones left out.
    given: dict[str, str] = field(default_factory=dict)
    #: The id the next page starts before, when this page is full.
    next_before: int | None = None
    #: The filters as checked (the time range said in people's times).
    wanted: AuditFilter = field(default_factory=AuditFilter)


def _zone(given: dict[str, str]) -> str:
    """The viewer's zone the form's times are in (UTC when the browser did not say)."""
    name = given.get("zone") or "UTC"
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidArgument("zone", f"is not a time zone name (like Europe/London), got {short_repr(name)}") from None
    return name


def _wall_time(given: dict[str, str], name: str, instead_of: str) -> str | None:
    """The form's ``from``/``to`` as an instant: a wall time in the viewer's zone."""
    text = given.get(name)
    if text is None:
        return None
    if given.get(instead_of):
        raise InvalidArgument(name, f"give either {name} or {instead_of}, not both")
    return form_time(name, text, _zone(given))


def checked_filter(given: dict[str, str], before: str, now: datetime) -> AuditFilter:
    """The query string's filters as ``list_audit`` takes them; ``since`` may also be one of the
    form's lengths (``24h``: back from now), and ``from``/``to`` stand for ``since``/``until`` as
    wall times in the viewer's ``zone``."""
    since = since_time(given.get("since"), now)
    start, end = _wall_time(given, "from", "since"), _wall_time(given, "to", "until")
    if start is not None and end is not None and datetime.fromisoformat(end) <= datetime.fromisoformat(start):
        raise InvalidArgument("to", "must be after from")
    cursor = None
    if before:
        # The address's name for list_audit's before_id: refused under the name the address uses.
        if not (before.isascii() and before.isdigit() and len(before) <= 12):
            raise InvalidArgument("before", f"must be an audit row id (digits), got {short_repr(before)}")
        cursor = int(before)
    return audit_filter(
        schedule=None if "schedule" not in given else name_arg(given["schedule"], "schedule"),
        actor=given.get("actor"),
        action=given.get("action"),
        since=start or since,
        until=end or given.get("until"),
        before_id=cursor,
    )


def audit_view(session: Session, wanted: AuditFilter, given: dict[str, str]) -> AuditView:
    rows = audit_rows(session, wanted, limit=PAGE_ROWS)
    names = {r["schedule"] for r in rows if r["schedule"]}
    zones = dict(session.execute(select(Schedule.name, Schedule.timezone).where(Schedule.name.in_(names))).all())
    full = len(rows) == PAGE_ROWS
    return AuditView(rows, zones, given, rows[-1]["id"] if full else None, wanted)


class AuditHandler(BaseHandler):
    @tornado.web.authenticated
    async def get(self) -> None:
        given = {}
        for name in FILTER_NAMES:
            value = self.get_argument(name, "")[:_ARGUMENT_CHARS]
            if value:
                given[name] = value
        before = self.get_argument("before", "")[:_ARGUMENT_CHARS]
        try:
            wanted = checked_filter(given, before, utcnow())
        except InvalidArgument as refused:
            self.set_status(400)
            self.page(
                "audit.html", v=AuditView([], {}, given), refused=str(refused), actions=ACTIONS, since=SINCE_CHOICES
            )
            return
        view = await self.read(audit_view, wanted, given)
        self.page("audit.html", v=view, refused=None, actions=ACTIONS, since=SINCE_CHOICES)
