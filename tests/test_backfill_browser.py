"""Backfills on the dashboard in a real browser (Debian's Chromium), as an operator in India does
them for a London schedule: the schedule page's form, the dry-run list, the confirmation, the
progress panel filling in until the backfill completes; and cancelling one after asking.
``CHORDBEAT_WEB_SCREENSHOTS=DIR`` saves the pages' screenshots there."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from celeryapp.application import ChordbeatCelery
from celeryapp.interfaces import backfill_service, service
from models import utcnow
from tests.support.chromium import chromium, confirm, log_in, no_iso, page_text
from tests.support.servers import wait_for
from tests.support.web_server import ADMIN, WebServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    with chromium() as driver:
        yield driver


def _shot(driver: WebDriver, name: str) -> None:
    if folder := os.environ.get("CHORDBEAT_WEB_SCREENSHOTS"):
        driver.save_screenshot(os.path.join(folder, f"dashboard-{name}.png"))


def _nightly(app: ChordbeatCelery, name: str, seconds: float) -> None:
    steps = [{"name": "s", "task": "chordbeat.examples.sleep", "kwargs": {"seconds": seconds}}]
    service.apply_schedule(app, {"name": name, "cron": "0 2 * * *", "timezone": "Europe/London", "steps": steps})


def _open(browser: WebDriver, web: WebServer, name: str) -> None:
    browser.get(f"{web.url}/schedule?name={name}")
    wait_for(lambda: browser.find_elements(By.ID, "live"), 20, what=f"{name}'s page")


def test_an_operator_backfills_from_the_schedule_page_and_watches_it_complete(
    app: ChordbeatCelery, worker: Any, browser: WebDriver
) -> None:
    _nightly(app, "nightly", 0.05)
    today = datetime.now(ZoneInfo("Europe/London")).date()
    with WebServer(app) as web:
        log_in(browser, web, ADMIN)
        browser.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": "Asia/Kolkata"})
        _open(browser, web, "nightly")
        said = browser.find_element(By.ID, "time-control").text
        assert said == (
            "version 1 · catch-up: latest (one run for missed slots) · calendar: none (every day runs) · "
            "DST: default rule (a skipped time runs at the change; a repeated one once, hourly ones twice)"
        ), said
        # The form's times are London's wall time (24-hour text fields).
        for field, day in (("backfill-from", today - timedelta(days=22)), ("backfill-to", today)):
            element = browser.find_element(By.ID, field)
            browser.execute_script("arguments[0].value = arguments[1]", element, f"{day:%Y-%m-%d}T00:00")
        browser.find_element(By.ID, "backfill-list").click()
        slots = wait_for(
            lambda: browser.find_elements(By.CSS_SELECTOR, "#backfill-slots li"), 20, what="the dry-run list"
        )
        assert isinstance(slots, list) and len(slots) == 20
        first = today - timedelta(days=22)
        assert re.fullmatch(
            # An hour part of 0 is left out ("22 d 4 min ago" just after 02:00 UTC).
            rf"{first:%Y-%m-%d} 02:00:00 \+0[01]:00 (GMT|BST), 0[67]:30 \S+ here, 2[12] d( \d+ h)?( \d+ min)? ago",
            slots[0].text,
        ), slots[0].text
        assert page_text(browser, "#backfill-more") == "… and 2 more"
        assert "This will start 22 runs of nightly, oldest first, one at a time" in page_text(browser, "#confirm-what")
        no_iso(browser)
        _shot(browser, "backfill-dry-run")
        assert backfill_service.list_backfills(app, "nightly") == []  # listing started nothing
        confirm(browser, reason="outage on the 3rd")
        wait_for(lambda: "/schedule?name=nightly" in browser.current_url, 20, what="the schedule page again")
        (backfill,) = backfill_service.list_backfills(app, "nightly")
        assert page_text(browser, ".flash") == f"nightly: backfill #{backfill['id']} started: 22 slots, oldest first"
        row = f"#backfill-{backfill['id']}"
        wait_for(
            lambda: "22/22 started, 22 completed" in page_text(browser, row), 60, what="the panel to show completion"
        )
        assert "completed" in page_text(browser, f"{row} .badge") and "outage on the 3rd" in page_text(browser, row)
        assert browser.find_element(By.CSS_SELECTOR, f"{row} progress").get_attribute("value") == "22"
        assert not browser.find_elements(By.CSS_SELECTOR, f"{row} .cancel-backfill")
        no_iso(browser)
        browser.execute_script("document.getElementById('backfills').scrollIntoView()")
        _shot(browser, "backfill-done")


def test_an_operator_cancels_a_backfill_after_saying_why(app: ChordbeatCelery, worker: Any, browser: WebDriver) -> None:
    _nightly(app, "slow", 30)
    now = utcnow()
    backfill_id = backfill_service.backfill_schedule(
        app, "slow", (now - timedelta(days=4)).isoformat(), now.isoformat()
    )["backfill_id"]
    with WebServer(app) as web:
        log_in(browser, web, ADMIN)
        _open(browser, web, "slow")
        row = f"#backfill-{backfill_id}"
        assert "1/4 started, 1 running" in page_text(browser, row)
        browser.find_element(By.CSS_SELECTOR, f"{row} .cancel-backfill").click()
        wait_for(lambda: browser.find_elements(By.ID, "confirm"), 20, what="the cancel confirmation")
        assert (
            page_text(browser, "#confirm-what")
            == f"This will cancel backfill #{backfill_id} of slow (1/4 started, 1 running)."
        )
        confirm(browser, reason="wrong range")
        wait_for(lambda: "/schedule?name=slow" in browser.current_url, 20, what="the schedule page again")
        assert page_text(browser, ".flash") == f"backfill #{backfill_id} cancelled (1/4 started, 1 running)"
        assert "cancelled" in page_text(browser, f"{row} .badge")
        assert not browser.find_elements(By.CSS_SELECTOR, f"{row} .cancel-backfill")
    assert backfill_service.get_backfill(app, backfill_id)["status"] == "cancelled"
    for execution in service.list_executions(app, schedule="slow", status="in_progress"):
        service.cancel_execution(app, execution["id"])  # the 30 s step need not be waited out
