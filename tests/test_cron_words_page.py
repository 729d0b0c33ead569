"""Cron's L, W and # in words where people read them: the dashboard in Chromium (the schedule list
and the schedule page, the words beside the expression)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from celeryapp.application import ChordbeatCelery
from celeryapp.interfaces import service
from tests.support.chromium import chromium, log_in, page_text, row_of
from tests.support.servers import wait_for
from tests.support.web_server import VIEWER, WebServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    with chromium() as driver:
        yield driver


def test_the_dashboard_says_l_w_and_hash_in_words(app: ChordbeatCelery, browser: WebDriver) -> None:
    steps = [{"name": "close", "task": "chordbeat.examples.sleep", "kwargs": {"seconds": 0}}]
    service.apply_schedule(
        app, {"name": "month-end", "cron": "0 18 LW * *", "timezone": "Europe/London", "steps": steps}
    )
    service.apply_schedule(app, {"name": "patch-day", "cron": "0 2 * * 2#2", "steps": steps})
    with WebServer(app) as web:
        log_in(browser, web, VIEWER)
        browser.get(web.url + "/")
        assert "at 18:00 on the last weekday of the month, Europe/London" in page_text(
            row_of(browser, "month-end"), "td"
        )
        assert "at 02:00 on the second Tuesday of the month, UTC" in page_text(row_of(browser, "patch-day"), "td")
        row_of(browser, "month-end").find_element(By.CSS_SELECTOR, "a.name").click()
        wait_for(lambda: "month-end" in browser.title or "/month-end" in browser.current_url, 20, what="the page")
        intro = browser.find_element(By.XPATH, "//p[code]").text
        assert intro.startswith("at 18:00 on the last weekday of the month, Europe/London 0 18 LW * * ·"), intro
