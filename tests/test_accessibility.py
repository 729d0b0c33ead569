"""Every dashboard page checked by axe-core (Deque's accessibility engine, from npm) in Chromium at
a phone's width (390 px) and a desktop's (1920 px): no "serious" or "critical" violation.

The pages are not listed by hand: a crawl from the login page follows every same-site link and
submits every GET form as it stands (the backfill page is a form's answer), one page per route
shape, so a page added to the navigation is checked without touching this file; and every route
of the app that serves a page must have been reached, so a page the crawl cannot reach is named
rather than silently skipped. ``make test`` installs axe-core (the Makefile's ``AXE_STAMP``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import tornado.web
from selenium.webdriver.remote.webdriver import WebDriver
from sqlalchemy import update

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.interfaces import limit_service, service
from celeryapp.interfaces.web.auth import parse_users
from celeryapp.interfaces.web.server import AliveHandler, make_app
from models import Schedule, transaction
from tests.support.alert_wiring import with_ops_webhook
from tests.support.axe import AXE, said, violations
from tests.support.chromium import chromium, log_in
from tests.support.helpers import wait_for
from tests.support.web_server import ADMIN, SECRET, USERS, WebServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

WIDTHS = ((390, 844), (1920, 1080))
#: Pages reached only when something is in a passing state (a step or a backfill still running):
#: their routes serve confirmation pages, the same template the crawl checks for run, pause and re-run.
ONLY_WHILE_RUNNING = {r"/act/(cancel|rerun)/([0-9]{1,12})", r"/act/(cancel-backfill)/([0-9]{1,12})"}


@pytest.fixture
def settings(settings: Settings, tmp_path: Path) -> Settings:
    return with_ops_webhook(settings, tmp_path)


@pytest.fixture(scope="module")
def axe_source() -> str:
    if not AXE.exists():
        # As with Chromium: the test is slow, so only a run that asked for everything meets this.
        pytest.fail(f"axe-core is not installed ({AXE} is missing): `make test` installs it from npm")
    return AXE.read_text()


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    with chromium() as driver:
        yield driver


def page_routes(chordbeat: ChordbeatCelery) -> list[str]:
    """The app's routes that serve a page to a person: a ``get`` of their own, not a live
    fragment, not the probe."""
    app = make_app(chordbeat, parse_users(USERS), SECRET)
    found = []
    for rule in app.wildcard_router.rules:
        handler = rule.target
        pattern = rule.matcher.regex.pattern.rstrip("$")  # type: ignore[attr-defined]
        if not (isinstance(handler, type) and issubclass(handler, tornado.web.RequestHandler)):
            continue
        if issubclass(handler, tornado.web.StaticFileHandler) or handler is AliveHandler:
            continue
        if "get" not in vars(handler) or "fragment" in pattern or "|step" in pattern:
            continue
        found.append(pattern)
    return found


def shape(url: str) -> str:
    """A page's route shape: its path with numbers as ``N``, and the names of its query's fields
    (the schedules list filtered is the same page, the audit page from a pager link too)."""
    parts = urlsplit(url)
    return re.sub(r"\d+", "N", parts.path)


def links_and_forms(browser: WebDriver) -> list[str]:
    """Every same-site address a person can reach from this page: links, and GET forms submitted
    as they stand, their required empty time fields filled in (the last days, in order)."""
    found: list[str] = browser.execute_script(
        """
        const here = location.origin;
        const out = [...document.querySelectorAll("a[href]")].map((a) => a.href);
        for (const form of document.querySelectorAll("form")) {
          if ((form.method || "get").toLowerCase() !== "get") continue;
          const data = new FormData(form);
          const times = [...form.querySelectorAll("input[type=datetime-local][required]")].filter((f) => !f.value);
          times.forEach((field, i) => {
            const at = new Date(Date.now() - (times.length - i) * 86400e3);
            data.set(field.name, at.toISOString().slice(0, 19));
          });
          const query = new URLSearchParams(data).toString();
          out.push(new URL(form.getAttribute("action") || location.pathname, location.href).href.split("?")[0]
                   + (query ? "?" + query : ""));
        }
        return out.filter((u) => u.startsWith(here)).map((u) => u.split("#")[0]);
        """
    )
    return found


def crawl(browser: WebDriver, web: WebServer, limit: int = 60) -> list[str]:
    """One address per route shape, breadth first from the schedules page (logged in)."""
    seen: dict[str, str] = {}
    queue = [web.url + "/"]
    while queue and len(seen) < limit:
        url = queue.pop(0)
        key = shape(url)
        if key in seen or key in ("/logout", "/healthz") or urlsplit(url).path.endswith("/fragment"):
            continue
        browser.get(url)
        if "/login" in browser.current_url and "/login" not in url:
            continue  # not a page of its own
        seen[key] = url
        queue.extend(links_and_forms(browser))
    return list(seen.values())


def test_every_page_has_no_serious_or_critical_axe_violation_at_390_and_1920_px(
    app: ChordbeatCelery, worker: Any, browser: WebDriver, settings: Settings, axe_source: str
) -> None:
    # Something on every page: a schedule whose run failed (an open alert, a re-run), another that
    # completed, and an audit trail of both.
    steps = [{"name": "load", "task": "chordbeat.examples.fail", "kwargs": {"message": "disk full: /data"}}]
    service.apply_schedule(app, {"name": "payroll", "cron": "0 2 * * *", "timezone": "Europe/London", "steps": steps})
    service.apply_schedule(
        app, {"name": "report", "every": 3600, "steps": [{"name": "s", "task": "chordbeat.examples.sleep"}]}
    )
    limit_service.apply_limit(app, {"name": "warehouse", "slots": 3, "key": "{payload.customer}"})  # /limit
    # Each changed once: a versions page links the change (/schedule/diff) and a rollback to the first.
    service.apply_schedule(
        app, {"name": "report", "every": 1800, "steps": [{"name": "s", "task": "chordbeat.examples.sleep"}]}
    )
    service.apply_schedule(app, {"name": "payroll", "cron": "0 3 * * *", "timezone": "Europe/London", "steps": steps})
    with transaction(settings.database_url) as session:
        alerts_on = {"channels": ["ops-webhook"], "on": ["failed"]}
        session.execute(update(Schedule).where(Schedule.name == "payroll").values(alerts=alerts_on))
    for name, status in (("payroll", "failed"), ("report", "completed")):
        run = service.trigger_schedule(app, name)["execution_id"]
        wait_for(lambda run=run, status=status: service.get_execution(app, run)["status"] == status, 30, what=name)

    problems: list[str] = []
    with WebServer(app) as web:
        browser.set_window_size(*WIDTHS[0])
        browser.delete_all_cookies()
        pages = [web.url + "/login"]
        log_in(browser, web, ADMIN)
        pages += crawl(browser, web)
        reached = {urlsplit(url).path for url in pages}
        missing = [
            p for p in page_routes(app) if p not in ONLY_WHILE_RUNNING and not any(re.fullmatch(p, r) for r in reached)
        ]
        assert not missing, (
            f"routes the crawl did not reach (link them, or give the test data that shows them): {missing}"
        )
        for width, height in WIDTHS:
            browser.set_window_size(width, height)
            for url in pages:
                if url.endswith("/login"):
                    browser.delete_all_cookies()
                browser.get(url)
                wait_for(lambda: browser.execute_script("return document.readyState") == "complete", 20, what=url)
                found = violations(browser, axe_source)
                if found:
                    problems.append(said(url.removeprefix(web.url), width, found))
                if url.endswith("/login"):
                    log_in(browser, web, ADMIN)
    checked = [p.removeprefix(web.url) for p in pages]
    print(f"axe-core checked {len(pages)} pages at {[w for w, _ in WIDTHS]} px: {checked}")
    assert not problems, "\n" + "\n".join(problems)
