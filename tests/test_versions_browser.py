"""Definition versions on the dashboard in a real browser (Debian's Chromium) at a desktop's and a
phone's width: from a failed run to the version it ran, to what changed from the version before,
and a rollback to that one, asked first; the runs grid marks where the version changed."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from sqlalchemy import update

from celeryapp.application import ChordbeatCelery
from celeryapp.interfaces import service
from models import ExecutionStatus, ScheduleExecution, transaction, utcnow
from tests.support.axe import AXE, said, violations
from tests.support.chromium import chromium, confirm, log_in, no_iso, nothing_wider_than_the_window, page_text
from tests.support.helpers import step, wait_for
from tests.support.run_history import Run, write_runs
from tests.support.web_server import ADMIN, WebServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    with chromium() as driver:
        yield driver


def payroll(full: bool) -> dict[str, Any]:
    return {
        "name": "payroll",
        "cron": "0 2 * * *",
        "timezone": "Europe/London",
        "steps": [step("HR import", kwargs={"full": full})],
    }


def runs_of_version(app: ChordbeatCelery, version: int, runs: list[Run]) -> list[int]:
    ids = write_runs(app, "payroll", runs, utcnow())
    with transaction(app.settings.database_url) as session:
        session.execute(update(ScheduleExecution).where(ScheduleExecution.id.in_(ids)).values(version=version))
    return ids


@pytest.mark.timeout(180)
def test_from_a_failed_run_to_what_changed_and_back_at_1920_and_390_px(
    app: ChordbeatCelery, browser: WebDriver
) -> None:
    if not AXE.exists():
        pytest.fail(f"{AXE} is missing: make test's set-up (AXE_STAMP) installs axe-core")
    axe = AXE.read_text()
    service.apply_schedule(app, payroll(False), actor="ann", reason="first")
    runs_of_version(app, 1, [Run(timedelta(days=2)), Run(timedelta(days=1))])
    with WebServer(app) as web:
        log_in(browser, web, ADMIN)
        for width, height in ((1920, 1080), (390, 844)):
            browser.set_window_size(width, height)
            changed = service.apply_schedule(app, payroll(True), actor="bob", reason="a full import each night")
            failed = runs_of_version(
                app,
                changed["version"],
                [Run(timedelta(hours=1), status=ExecutionStatus.FAILED, error="import timed out")],
            )[0]

            # The failed run says which version it ran; that version's changes from the one before.
            browser.get(f"{web.url}/execution/{failed}")
            version = wait_for(lambda: browser.find_elements(By.ID, "run-version"), 20, what="the run's version")[0]
            assert version.text == f"v{changed['version']}"
            version.click()
            wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "tr.version-row"), 20, what="the versions")
            row = browser.find_element(By.ID, f"version-{changed['version']}")
            assert "bob" in row.text and "a full import each night" in row.text and "current" in row.text
            # Its failure rate beside the one before's.
            assert page_text(row, ".version-runs") == "1 run, 1 failed (100 %)"
            before = browser.find_element(By.ID, f"version-{changed['version'] - 1}")
            assert page_text(before, ".version-runs") == ("2 runs, 0 failed" if width == 1920 else "no runs")
            row.find_element(By.CSS_SELECTOR, "a.changes").click()
            wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "table.diff"), 20, what="the diff")
            cells = [
                (page_text(r, "th"), page_text(r, "td.old"), page_text(r, "td.new"))
                for r in browser.find_elements(By.CSS_SELECTOR, "tr.diff-row")
            ]
            assert cells == [("steps[HR import].kwargs.full", "false", "true")], cells
            nothing_wider_than_the_window(browser)
            found = violations(browser, axe)
            assert not found, said("/schedule/diff", width, found)

            # Back to the version before, asked first, with what will change shown.
            browser.find_element(By.LINK_TEXT, "All versions").click()
            good = changed["version"] - 1
            wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "a.rollback"), 20, what="the versions")
            browser.find_element(By.ID, f"version-{good}").find_element(By.CSS_SELECTOR, "a.rollback").click()
            wait_for(lambda: browser.find_elements(By.ID, "confirm-what"), 20, what="the rollback's page")
            assert page_text(browser, "tr.diff-row td.new") == "false"
            nothing_wider_than_the_window(browser)
            if folder := os.environ.get("CHORDBEAT_WEB_SCREENSHOTS"):
                browser.save_screenshot(os.path.join(folder, f"dashboard-rollback-{width}.png"))
            confirm(browser, reason="the full import times out")
            wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "p.flash"), 20, what="the rollback's message")
            rolled = changed["version"] + 1
            assert page_text(browser, "p.flash") == f"payroll: version {rolled} (the definition of version {good})"
            assert "current" in browser.find_element(By.ID, f"version-{rolled}").text
            now = service.get_schedule(app, "payroll")
            assert now["version"] == rolled and now["steps"] == [step("HR import", kwargs={"full": False})]
            trail = service.list_audit(app, "payroll", limit=1)[0]
            assert (trail["action"], trail["actor"], trail["source"]) == ("rollback", ADMIN[0], "web")
            nothing_wider_than_the_window(browser)
            no_iso(browser)

            # The runs grid marks the run where the version changed.
            browser.get(f"{web.url}/schedule?name=payroll")
            wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "table.grid"), 20, what="the grid")
            marks = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "table.grid th.vchange .gver")]
            assert f"v{changed['version']}" in marks, marks
            # And the schedule page itself says which version fails, linked to what it changed.
            rates = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#failures-by-version li")]
            assert rates[0] == f"version {changed['version']}: 1 run, 1 failed (100 %)", rates
            assert rates[-1] == "version 1: 2 runs, 0 failed", rates
            link = browser.find_element(By.CSS_SELECTOR, "#failures-by-version li a")
            assert link.get_attribute("href").endswith(f"a={changed['version'] - 1}&b={changed['version']}")
            assert page_text(browser, "#versions-link") == f"version {rolled}"
            nothing_wider_than_the_window(browser)
            if folder := os.environ.get("CHORDBEAT_WEB_SCREENSHOTS"):
                browser.save_screenshot(os.path.join(folder, f"dashboard-versions-{width}.png"))
