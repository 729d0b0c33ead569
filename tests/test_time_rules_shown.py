"""A schedule's catch-up, calendar and DST rules in words: ``chordbeat show`` as a person at an
80-column terminal in India sees it (a real worker), and the schedule page over HTTP, which also
offers admins the Backfill form."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.interfaces import service
from tests.support import processes
from tests.support.helpers import call, step
from tests.support.terminals import in_pty, plain_lines, screen_lines, wide_lines
from tests.support.web_server import ADMIN, VIEWER, WebServer, text_of

CHORDBEAT = str(Path(sys.executable).with_name("chordbeat"))


def _show(settings: Settings, name: str) -> tuple[int, list[str]]:
    env = processes.settings_env(settings, TERM="xterm-256color", TZ="Asia/Kolkata")
    status, output = in_pty([CHORDBEAT, "show", name], env, columns=80, timeout=60)
    return status, plain_lines("\n".join(screen_lines(output)))


def _nightly(client: Any, name: str, **fields: Any) -> None:
    definition = {"name": name, "cron": "0 2 * * *", "timezone": "Europe/London", "steps": [step("s")], **fields}
    call(client, "chordbeat.apply_schedule", definition=definition)


def test_show_says_catch_up_calendar_and_dst_in_words(
    app: ChordbeatCelery, worker: Any, client: Any, settings: Settings
) -> None:
    _nightly(client, "plain")
    calendar = {"exclude": ["2030-12-25", "2030-12-26"], "on_excluded": "skip"}
    catchup = {"policy": "all", "window": 7200, "max_runs": 3}
    _nightly(client, "tuned", calendar=calendar, catchup=catchup, dst={"repeated": "last", "missing": "skip"})
    call(client, "chordbeat.apply_schedule", definition={"name": "ticker", "every": 60, "steps": [step("s")]})
    said = {}
    for name in ("plain", "tuned", "ticker"):
        status, lines = _show(settings, name)
        assert status == 0 and not wide_lines(lines), (name, wide_lines(lines))
        said[name] = " ".join(" ".join(lines).split())
    assert "catch-up: latest (one run for missed slots)" in said["plain"], said["plain"]
    assert "calendar: none (every day runs)" in said["plain"] and "DST: default rule" in said["plain"]
    assert "catch-up: all (each missed slot of the last 2 h, at most 3 runs, oldest first)" in said["tuned"]
    assert "calendar: 2 dates excluded; excluded days do not run" in said["tuned"], said["tuned"]
    assert "DST: a repeated time runs at its second pass; a skipped time does not run that day" in said["tuned"]
    assert "catch-up: latest" in said["ticker"] and "DST" not in said["ticker"]  # an interval: absolute time


def test_the_schedule_page_says_its_time_rules_and_offers_admins_a_backfill(app: ChordbeatCelery) -> None:
    steps = [step("s")]
    plain = {"name": "plain", "cron": "0 2 * * *", "timezone": "Europe/London", "steps": steps}
    calendar = {"exclude": ["2030-12-25"], "on_excluded": "skip"}
    service.apply_schedule(app, plain)
    service.apply_schedule(
        app,
        {**plain, "name": "tuned", "calendar": calendar, "catchup": {"policy": "none"}, "dst": {"repeated": "both"}},
    )
    with WebServer(app) as web:
        viewer, admin = web.session(VIEWER), web.session(ADMIN)
        page = text_of(admin.get(web.url + "/schedule?name=plain", timeout=10).text)
        assert (
            "catch-up: latest (one run for missed slots) · calendar: none (every day runs) · DST: default rule" in page
        )
        assert "Backfill (run past slots again or for the first time)" in page
        assert "in Europe/London time (the schedule's zone, as the CLI's --from/--to)" in page
        page = text_of(viewer.get(web.url + "/schedule?name=tuned", timeout=10).text)
        assert "Backfill (run" not in page  # viewers may not act
        assert (
            "catch-up: none (missed slots are not made up; a slot fired late does not run) · "
            "calendar: 1 date excluded; excluded days do not run · "
            "DST: a repeated time runs at both passes; a skipped time: default rule"
        ) in page, page
