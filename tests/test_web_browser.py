"""The dashboard in a real browser: Debian's Chromium driven by its chromedriver (Selenium,
tests/support/chromium.py). One browser serves the whole module. ``CHORDBEAT_WEB_SCREENSHOTS=DIR`` saves
screenshots of the pages there (docs/img holds the ones the docs show).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from celeryapp.application import ChordbeatCelery
from celeryapp.interfaces import service
from tests.support.chromium import ISO, chromium
from tests.support.chromium import confirm as _confirm
from tests.support.chromium import log_in as _log_in
from tests.support.chromium import no_iso as _no_iso
from tests.support.chromium import page_text as _text
from tests.support.chromium import row_of as _row
from tests.support.servers import wait_for
from tests.support.web_server import ADMIN, VIEWER, WebServer

pytestmark = pytest.mark.slow
#: The badge colour of a run completed with warnings (dashboard.css --warn).
WARNING_YELLOW = "rgba(214, 158, 46, 1)"


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    with chromium() as driver:
        yield driver


def _shot(driver: WebDriver, name: str) -> None:
    folder = os.environ.get("CHORDBEAT_WEB_SCREENSHOTS")
    if folder:
        driver.save_screenshot(os.path.join(folder, f"dashboard-{name}.png"))


def test_an_operator_watches_cancels_reads_an_error_and_pauses(
    app: ChordbeatCelery, worker: Any, browser: WebDriver
) -> None:
    for definition in (
        {
            "name": "slow-sync",
            "cron": "0 2 * * *",
            "timezone": "Europe/London",
            "payload": {"region": "eu"},
            "steps": [
                {"name": "import", "task": "chordbeat.examples.sleep", "kwargs": {"seconds": 1}},
                [
                    {"name": "export", "task": "chordbeat.examples.sleep", "kwargs": {"seconds": 120}},
                    {"name": "report", "task": "chordbeat.examples.warn", "kwargs": {"message": "2 rows skipped"}},
                ],
            ],
        },
        {
            "name": "breaks",
            "every": 3600,
            "steps": [{"name": "load", "task": "chordbeat.examples.fail", "kwargs": {"message": "disk full: /data"}}],
        },
    ):
        service.apply_schedule(app, definition)
    with WebServer(app) as web:
        _log_in(browser, web, ADMIN)
        # The viewer's zone beside the schedule's, filled in by the browser.
        browser.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": "Asia/Kolkata"})
        browser.get(web.url + "/")
        assert re.search(r"02:00:00 \+00:00 GMT, 07:30 \S+ here, in ", _text(_row(browser, "slow-sync"), "td"))
        _no_iso(browser)

        # Run now asks first, with the schedule's payload to edit: a JSON mistake is shown where
        # it is and starts nothing; then the browser lands on the new run's page.
        _row(browser, "slow-sync").find_element(By.CSS_SELECTOR, ".act-run").click()
        wait_for(lambda: browser.find_elements(By.ID, "payload"), 20, what="the run-now confirmation")
        assert '"region": "eu"' in (browser.find_element(By.ID, "payload").get_attribute("value") or "")
        _confirm(browser, payload='{"region": "us",\n"rows": }')
        wait_for(lambda: "line 2, column 9" in _text(browser, "#confirm-error"), 20, what="the JSON mistake")
        assert service.list_executions(app, schedule="slow-sync") == []
        _confirm(browser, payload='{"region": "us"}')
        wait_for(lambda: "/execution/" in browser.current_url, 20, what="the new run's page")
        run = service.list_executions(app, schedule="slow-sync")[0]["id"]
        assert browser.current_url == f"{web.url}/execution/{run}"
        assert '"region": "us"' in _text(browser, "#payload")

        # Watch the run on its page: it moves on without a reload.
        browser.execute_script("window.__sameDocument = true;")
        wait_for(
            lambda: "completed import" in _text(browser, ".glabel") and "running export" in _text(browser, ".glabel"),
            40,
            what="the first group to finish and the long step to run, live",
        )
        assert browser.execute_script("return window.__sameDocument === true;"), "the page was reloaded"
        _no_iso(browser)
        _shot(browser, "execution")

        # Cancel says what it will stop and asks why; the run then says who cancelled it.
        browser.find_element(By.ID, "cancel").click()
        wait_for(lambda: browser.find_elements(By.ID, "confirm-what"), 20, what="the cancel confirmation")
        assert re.search(rf"cancel execution {run} of slow-sync, running \d+(\.\d)? s", _text(browser, "#confirm-what"))
        assert service.get_execution(app, run)["status"] == "in_progress"
        _shot(browser, "confirm")
        _confirm(browser, reason="wrong region")
        wait_for(lambda: _text(browser, "#run-status") == "cancelled", 30, what="the run to show cancelled")
        assert re.search(r"cancelled by ops \(web\) (now|\d+ s ago): wrong region", _text(browser, "#run-cancelled"))
        assert service.get_execution(app, run)["status"] == "cancelled"
        assert not browser.find_elements(By.ID, "cancel")
        trail = _text(browser, "table.audit")
        assert re.search(r"ops \(web\) cancel wrong region", trail) and "ops (web) trigger" in trail

        # A failed step's error, from the runs x steps grid of its schedule.
        failed = service.trigger_schedule(app, "breaks")["execution_id"]
        wait_for(lambda: service.get_execution(app, failed)["status"] == "failed", 30, what="the run to fail")
        browser.get(f"{web.url}/schedule?name=breaks")
        browser.find_element(By.CSS_SELECTOR, "a.cell.s-failed_with_error").click()
        wait_for(lambda: "disk full: /data" in _text(browser, "#detail"), 20, what="the step's error in the panel")
        _no_iso(browser)
        _shot(browser, "schedule")

        # Pause from the list: no reason, no pause (the form will not go); with one, the list says it.
        browser.get(web.url + "/")
        _row(browser, "breaks").find_element(By.CSS_SELECTOR, ".act-pause").click()
        _confirm(browser)
        assert browser.find_elements(By.ID, "confirm") and service.get_schedule(app, "breaks")["status"] == "active"
        _confirm(browser, reason="disk full, ticket 4711")
        wait_for(lambda: "breaks: paused" in _text(browser, ".flash"), 20, what="the pause message")
        assert re.search(r"paused by ops since .* · reason: disk full, ticket 4711", _row(browser, "breaks").text)
        assert service.get_schedule(app, "breaks")["status"] == "paused"
        _no_iso(browser)
        _shot(browser, "schedules")
        if os.environ.get("CHORDBEAT_WEB_SCREENSHOTS"):
            browser.set_window_size(390, 844)
            _shot(browser, "phone")
            browser.set_window_size(1280, 900)
        browser.get(web.url + "/health")
        wait_for(lambda: "alive" in _text(browser, "main"), 20, what="the health page")
        _no_iso(browser)
        _shot(browser, "health")

        # A viewer sees the same pages without a single button that acts.
        _log_in(browser, web, VIEWER)
        assert "slow-sync" in _text(browser, "table.schedules")
        assert not browser.find_elements(By.CSS_SELECTOR, ".actions button")
        browser.get(f"{web.url}/execution/{run}")
        assert "cancelled" in _text(browser, "#run-status")
        assert not browser.find_elements(By.ID, "rerun")


def test_runs_show_warnings_failures_honest_counts_and_rerun_from_the_failed_group(
    app: ChordbeatCelery, worker: Any, browser: WebDriver
) -> None:
    for definition in (
        {
            "name": "nightly",
            "cron": "0 2 * * *",
            "timezone": "Europe/London",
            "payload": {"day": "monday"},
            "steps": [
                {"name": "prepare", "task": "chordbeat.examples.sleep", "kwargs": {"seconds": 0.1}},
                {"name": "load", "task": "chordbeat.examples.fail", "kwargs": {"message": "disk full: /data"}},
            ],
        },
        {
            "name": "warns",
            "every": 3600,
            "steps": [{"name": "report", "task": "chordbeat.examples.warn", "kwargs": {"message": "2 rows skipped"}}],
        },
    ):
        service.apply_schedule(app, definition)
    failed = service.trigger_schedule(app, "nightly")["execution_id"]
    warned = service.trigger_schedule(app, "warns")["execution_id"]
    for run in (failed, warned):
        wait_for(lambda run=run: service.get_execution(app, run)["completed_at"], 30, what=f"run {run} to end")
    with WebServer(app) as web:
        _log_in(browser, web, ADMIN)

        # A run with a warning step is yellow "completed with warnings" on the list's strip.
        badge = _row(browser, "warns").find_element(By.CSS_SELECTOR, "td[data-label='Last runs'] .badge")
        assert badge.text == "completed with warnings"
        assert "s-warnings" in (badge.get_attribute("class") or "")
        assert badge.value_of_css_property("background-color") == WARNING_YELLOW
        assert _row(browser, "warns").find_elements(By.CSS_SELECTOR, ".tick.s-warnings")

        # The grid: honest counts, dates and durations above the columns, a legend, no stored names.
        browser.get(f"{web.url}/schedule?name=nightly")
        assert _text(browser, "#run-counts") == "runs 1 (1 failed) · successful 0"
        assert re.search(r"#\d+\s+\d\d-\d\d \d\d:\d\d\s+\d+(\.\d)? s", _text(browser, ".grid thead th:nth-child(2)"))
        legend = _text(browser, "#legend")
        assert "failed" in legend and "completed with warnings" in legend and "not reached" in legend
        assert not re.search(r"_with_", _text(browser, "main"))
        titles = [e.get_attribute("title") or "" for e in browser.find_elements(By.CSS_SELECTOR, ".grid [title]")]
        assert titles and not [t for t in titles if "_with_" in t or ISO.search(t)]
        _no_iso(browser)
        browser.get(f"{web.url}/schedule?name=warns")
        assert browser.find_elements(By.CSS_SELECTOR, ".runstate .cell.s-warnings")
        browser.get(f"{web.url}/execution/{warned}")
        status = browser.find_element(By.ID, "run-status")
        assert status.text == "completed with warnings" and "s-warnings" in (status.get_attribute("class") or "")
        assert status.value_of_css_property("background-color") == WARNING_YELLOW

        # Re-run the failed run from its failed group: a confirmation, then the new run, linked
        # both ways, its first group taken from the source.
        browser.get(f"{web.url}/execution/{failed}")
        browser.find_element(By.ID, "rerun").click()
        wait_for(lambda: browser.find_elements(By.ID, "confirm-what"), 20, what="the re-run confirmation")
        assert f"re-run execution {failed} of nightly from group 2" in _text(browser, "#confirm-what")
        _confirm(browser, reason="disk cleaned")
        wait_for(lambda: browser.find_elements(By.ID, "rerun-of"), 20, what="the re-run's page")
        rerun = service.list_executions(app, schedule="nightly")[0]["id"]
        assert rerun != failed and browser.current_url == f"{web.url}/execution/{rerun}"
        assert _text(browser, "#rerun-of") == f"Re-run of #{failed} from group 2"
        assert f"Group 1 taken from #{failed}" in _text(browser, ".ggroup")
        assert '"day": "monday"' in _text(browser, "#payload")
        assert re.search(r"ops \(web\) rerun disk cleaned", _text(browser, "table.audit"))
        browser.get(f"{web.url}/execution/{failed}")
        assert f"#{rerun}" in _text(browser, "#reruns")
