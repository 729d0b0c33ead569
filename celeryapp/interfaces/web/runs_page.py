"""The dashboard's ``/runs`` page: every run across schedules, newest first, filtered by state,
schedule, trigger and time, paged by cursor, its table refreshed while the page is open; and the
slowest schedules and those getting slower, of the runs the filters pick (state aside: durations
are those of completed runs), refreshed while the page is open too. The filters live in the query string, so a filtered
page's address can be sent to someone else; a refusal names the field on the page."""

from __future__ import annotations

import tornado.web

from celeryapp.domain.durations import SLOWER_MIN_S, SLOWER_RATIO, TREND_RUNS
from celeryapp.errors import InvalidArgument
from celeryapp.interfaces.web.base import BaseHandler
from celeryapp.interfaces.web.duration_trends import CANDIDATES, LISTED, WINDOW, TrendsView, trends_view
from celeryapp.interfaces.web.run_list import (
    FILTER_NAMES,
    STATES,
    TRIGGERS,
    RunsView,
    checked_run_filter,
    runs_view,
)
from celeryapp.interfaces.web.since_choices import SINCE_CHOICES
from models import utcnow

#: Query-string values longer than this are cut before they are checked (each check refuses far less).
_ARGUMENT_CHARS = 300


class RunsHandler(BaseHandler):
    def decode_argument(self, value: bytes, name: str | None = None) -> str:
        # Tornado's own refusal says the field in its log only; the page says it too.
        try:
            return super().decode_argument(value, name)
        except tornado.web.HTTPError:
            field = name if name in (*FILTER_NAMES, "before") else "argument"
            raise tornado.web.HTTPError(400, reason=f"{field}: must be UTF-8 text") from None

    @tornado.web.authenticated
    async def get(self, fragment: str | None = None) -> None:
        given = {}
        for name in FILTER_NAMES:
            value = self.get_argument(name, "")[:_ARGUMENT_CHARS]
            if value:
                given[name] = value
        before = self.get_argument("before", "")[:_ARGUMENT_CHARS]
        now = utcnow()
        try:
            wanted = checked_run_filter(given, before, now)
        except InvalidArgument as refused:
            view = RunsView([], given, refused=str(refused))
        else:
            if fragment == "trends":
                view = RunsView([], given, wanted)  # it shows no runs: only the checked filters
            else:
                view = await self.read(runs_view, wanted, given)
        if view.refused:
            self.set_status(400)
        if fragment == "fragment":
            self.render("_runs_live.html", v=view, user=self.user)
            return
        trends = TrendsView() if view.refused else await self.read(trends_view, now, view.wanted)
        described = {
            "trends": trends,
            "window_h": int(WINDOW.total_seconds() // 3600),
            "candidates": CANDIDATES,
            "listed": LISTED,
            "rule": {"runs": TREND_RUNS, "ratio": SLOWER_RATIO, "min_s": SLOWER_MIN_S},
        }
        if fragment == "trends":
            self.render("_runs_trends.html", v=view, user=self.user, **described)
            return
        self.page("runs.html", v=view, states=STATES, triggers=TRIGGERS, since=SINCE_CHOICES, **described)
