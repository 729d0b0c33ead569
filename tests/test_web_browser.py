"""The dashboard in a real browser: Debian's Chromium driven by its chromedriver (Selenium).

Nothing is downloaded: the driver and the browser are the system's (deploy/local/system-deps.sh
installs them). One browser serves the whole module. ``CHORDBEAT_WEB_SCREENSHOTS=DIR`` saves
screenshots of the pages there (docs/img holds the ones the docs show).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from celeryapp.application import ChordbeatCelery
from celeryapp.interfaces import service
from tests.servers import wait_for
from tests.web_server import ADMIN, VIEWER, WebServer

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,900",
)


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.fail("chromium and chromium-driver are not installed (make test installs them)")
    profile = tempfile.mkdtemp(prefix="chordbeat-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def _shot(driver: WebDriver, name: str) -> None:
    folder = os.environ.get("CHORDBEAT_WEB_SCREENSHOTS")
    if folder:
        driver.save_screenshot(os.path.join(folder, f"dashboard-{name}.png"))


def _log_in(driver: WebDriver, web: WebServer, user: tuple[str, str]) -> None:
    driver.delete_all_cookies()
    driver.get(web.url + "/")
    assert "/login" in driver.current_url  # no session: the login form, not the page
    driver.find_element(By.NAME, "username").send_keys(user[0])
    driver.find_element(By.NAME, "password").send_keys(user[1])
    driver.find_element(By.ID, "login").click()
    wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, "table.schedules"), 20, what="the schedules page")


def _text(driver: WebDriver, css: str) -> str:
    return " ".join(e.text for e in driver.find_elements(By.CSS_SELECTOR, css))


def _row(driver: WebDriver, name: str) -> Any:
    return driver.find_element(By.XPATH, f"//tr[.//a[contains(@class, 'name') and text()='{name}']]")


def test_an_operator_watches_cancels_reads_an_error_and_pauses(
    app: ChordbeatCelery, worker: Any, browser: WebDriver
) -> None:
    for definition in (
        {
            "name": "slow-sync",
            "cron": "0 2 * * *",
            "timezone": "Europe/London",
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

        # Run now, then watch the run on its page: it moves on without a reload.
        _row(browser, "slow-sync").find_element(By.CSS_SELECTOR, ".act-run").click()
        wait_for(lambda: "started" in _text(browser, ".flash"), 20, what="the run-now message")
        run = service.list_executions(app, schedule="slow-sync")[0]["id"]
        browser.get(f"{web.url}/execution/{run}")
        browser.execute_script("window.__sameDocument = true;")
        wait_for(
            lambda: (
                "complete import" in _text(browser, ".glabel") and "in progress export" in _text(browser, ".glabel")
            ),
            40,
            what="the first group to finish and the long step to run, live",
        )
        assert browser.execute_script("return window.__sameDocument === true;"), "the page was reloaded"
        _shot(browser, "execution")

        browser.find_element(By.ID, "cancel").click()
        wait_for(lambda: _text(browser, "#run-status") == "cancelled", 30, what="the run to show cancelled")
        assert service.get_execution(app, run)["status"] == "cancelled"
        assert not browser.find_elements(By.ID, "cancel")

        # A failed step's error, from the runs x steps grid of its schedule.
        failed = service.trigger_schedule(app, "breaks")["execution_id"]
        wait_for(lambda: service.get_execution(app, failed)["status"] == "failed", 30, what="the run to fail")
        browser.get(f"{web.url}/schedule?name=breaks")
        browser.find_element(By.CSS_SELECTOR, "a.cell.s-failed_with_error").click()
        wait_for(lambda: "disk full: /data" in _text(browser, "#detail"), 20, what="the step's error in the panel")
        _shot(browser, "schedule")

        # Pause from the list.
        browser.get(web.url + "/")
        _row(browser, "breaks").find_element(By.CSS_SELECTOR, ".act-pause").click()
        wait_for(lambda: "breaks: paused" in _text(browser, ".flash"), 20, what="the pause message")
        assert "paused" in _row(browser, "breaks").text
        assert service.get_schedule(app, "breaks")["status"] == "paused"
        _shot(browser, "schedules")
        if os.environ.get("CHORDBEAT_WEB_SCREENSHOTS"):
            browser.set_window_size(390, 844)
            _shot(browser, "phone")
            browser.set_window_size(1280, 900)
        browser.get(web.url + "/health")
        wait_for(lambda: "alive" in _text(browser, "main"), 20, what="the health page")
        _shot(browser, "health")

        # A viewer sees the same pages without a single button that acts.
        _log_in(browser, web, VIEWER)
        assert "slow-sync" in _text(browser, "table.schedules")
        assert not browser.find_elements(By.CSS_SELECTOR, ".actions button")
        browser.get(f"{web.url}/execution/{run}")
        assert "cancelled" in _text(browser, "#run-status")
