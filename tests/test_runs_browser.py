"""The Runs page in a real browser (Debian's Chromium) at a phone's and a desktop's width, read as
an operator reads it on their second day: what failed in the last 24 hours and why, which schedule
is slowest and which is getting slower, in one page view each; the table refreshing while the
page is open; nothing wider than the phone's screen."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from datetime import timedelta

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from celeryapp.application import ChordbeatCelery
from celeryapp.domain.durations import TREND_RUNS
from models import ExecutionStatus, utcnow
from tests.support.axe import AXE, said, violations
from tests.support.chromium import chromium, log_in, no_iso, page_text
from tests.support.helpers import wait_for
from tests.support.run_history import Run, define, hourly, write_runs
from tests.support.web_server import ADMIN, WebServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    with chromium() as driver:
        yield driver


#: A row of the "Slowest schedules" section.
SLOWEST = "#slowest tr.trend-row"


def failures(browser: WebDriver) -> list[tuple[str, str]]:
    """(schedule, error) of each row shown, top to bottom (read in one go: the table is refreshed
    under the reader every few seconds)."""
    rows = browser.execute_script(
        "return [...document.querySelectorAll('tr.run-row')].map(r =>"
        " [r.querySelector('.name').textContent, r.querySelector('.error-text').textContent])"
    )
    return [(name, error) for name, error in rows]


@pytest.mark.timeout(120)  # two widths, each waiting for the trends' 10 s refresh
def test_an_operator_reads_what_failed_and_which_schedule_is_slowest_at_390_and_1920_px(
    app: ChordbeatCelery, browser: WebDriver
) -> None:
    # The accessibility test's crawl reaches one schedule page, which has no chart: checked here.
    if not AXE.exists():
        pytest.fail(f"{AXE} is missing: make test's set-up (AXE_STAMP) installs axe-core")
    axe = AXE.read_text()
    now = utcnow()
    for name, zone in (("payroll", "Europe/London"), ("reports", "UTC"), ("etl", "UTC"), ("quick", "UTC")):
        define(app, name, zone)

    # etl: the slowest, and getting slower (1 min 40 s against 1 min); quick: 5 s throughout.
    write_runs(app, "etl", hourly([60.0] * TREND_RUNS + [100.0] * TREND_RUNS), now)
    write_runs(app, "quick", hourly([5.0] * 2 * TREND_RUNS), now)
    write_runs(
        app,
        "payroll",
        [
            Run(timedelta(days=2), status=ExecutionStatus.FAILED, error="last week's failure"),
            Run(timedelta(hours=5), status=ExecutionStatus.FAILED, error="step 'load' failed: disk full"),
        ],
        now,
    )
    write_runs(
        app, "reports", [Run(timedelta(hours=20), status=ExecutionStatus.FAILED, error="step 'mail' timed out")], now
    )
    # One steady schedule per width, for its filtered trend to change while the page is open.
    for width in (1920, 390):
        define(app, f"steady-{width}")
        write_runs(app, f"steady-{width}", hourly([5.0] * 2 * TREND_RUNS), now)

    appeared: list[tuple[str, str]] = []
    with WebServer(app) as web:
        log_in(browser, web, ADMIN)
        browser.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": "Asia/Kolkata"})
        for width, height in ((1920, 1080), (390, 844)):
            browser.set_window_size(width, height)
            browser.get(web.url + "/")
            browser.find_element(By.LINK_TEXT, "Runs").click()  # in the navigation
            wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "tr.run-row"), 20, what="the runs")

            # Which schedule is slowest, and is it getting slower? Read off the same page.
            slowest = browser.find_elements(By.CSS_SELECTOR, "#slowest tr.trend-row")
            assert slowest[0].find_element(By.CSS_SELECTOR, "a.name").text == "etl"
            assert page_text(slowest[0], ".p50") == "1 min 40 s"
            slower = browser.find_elements(By.CSS_SELECTOR, "#slower tr.trend-row")
            assert [r.find_element(By.CSS_SELECTOR, "a.name").text for r in slower] == ["etl"]
            assert page_text(slower[0], ".before") == "1 min" and page_text(slower[0], ".ratio") == "1.67"
            assert "at least 1.25 times the p50" in page_text(browser, "#trend-rule")

            # What failed in the last 24 h, and why: the form's filters, an address to send on.
            Select(browser.find_element(By.NAME, "state")).select_by_visible_text("failed")
            Select(browser.find_element(By.NAME, "since")).select_by_value("24h")
            browser.find_element(By.CSS_SELECTOR, "#runs-filters button").click()
            wait_for(lambda: "state=failed" in browser.current_url, 20, what="the filtered page")
            assert failures(browser) == [
                *appeared[::-1],
                ("payroll", "step 'load' failed: disk full"),
                ("reports", "step 'mail' timed out"),
            ]
            # The trend sections follow the filters but the state: the last 24 h hold only 24 of
            # etl's runs, too few to compare two windows of 20; the page says the state filter
            # does not apply to durations.
            assert browser.find_elements(By.ID, "none-slower")
            assert "state filter does not apply" in page_text(browser, "#trend-scope")
            payroll = browser.execute_script(
                "return [...document.querySelectorAll('tr.run-row')]"
                ".find(r => r.querySelector('.name').textContent === 'payroll').innerText"
            )
            # In payroll's zone, with the viewer's (Kolkata) beside it, dated when its day differs.
            zone_then_here = r"\d\d:\d\d:\d\d \+00:00 GMT, (\d{4}-\d\d-\d\d )?\d\d:\d\d \S+ here, 5 h"
            assert re.search(zone_then_here, payroll), payroll
            no_iso(browser)

            # Live while open: a run that fails now appears without a reload.
            live = browser.find_element(By.ID, "runs-live")
            assert live.get_attribute("aria-live") == "polite"
            new = (
                "quick",
                {1920: "step 'fetch' failed: connection refused", 390: "step 'fetch' failed: HTTP 503"}[width],
            )
            write_runs(app, "quick", [Run(timedelta(seconds=1), status=ExecutionStatus.FAILED, error=new[1])], utcnow())
            appeared.append(new)
            wait_for(lambda n=new: failures(browser)[0] == n, 20, what="the live refresh")  # type: ignore[misc]

            if folder := os.environ.get("CHORDBEAT_WEB_SCREENSHOTS"):
                browser.save_screenshot(os.path.join(folder, f"dashboard-runs-{width}.png"))
            found = violations(browser, axe)
            assert not found, said("/runs", width, found)
            wide = browser.execute_script(
                "const d = document.documentElement; return [d.scrollWidth, d.clientWidth,"
                " [...document.querySelectorAll('main *')].filter(e => e.getBoundingClientRect().right > d.clientWidth)"
                ".map(e => e.tagName + '.' + e.className + ':' + e.textContent.slice(0, 40)).slice(-5)]"
            )
            assert wide[0] <= wide[1], wide
            if width == 390:  # stacked into cards
                shown = browser.execute_script(
                    "return getComputedStyle(document.querySelector('tr.run-row td')).display"
                )
                assert shown == "block"

            # The schedule's own page: its durations as a chart, the figures in words.
            browser.find_element(By.CSS_SELECTOR, "#slowest a.name").click()
            wait_for(lambda: browser.find_elements(By.ID, "duration-chart"), 20, what="the duration chart")
            assert len(browser.find_elements(By.CSS_SELECTOR, "#duration-chart rect.bar")) == 2 * TREND_RUNS
            assert page_text(browser, "#duration-summary").endswith("p50 1 min (getting slower)")
            if folder := os.environ.get("CHORDBEAT_WEB_SCREENSHOTS"):
                browser.execute_script("document.getElementById('durations').scrollIntoView()")
                browser.save_screenshot(os.path.join(folder, f"dashboard-durations-{width}.png"))
            found = violations(browser, axe)
            assert not found, said("/schedule?name=etl", width, found)
            chart = browser.find_element(By.ID, "duration-chart").rect
            assert 0 < chart["width"] <= width and chart["height"] > 0

            # One schedule's trend, refreshed while the page is open: its runs now take 6 s.
            steady = f"steady-{width}"
            browser.get(f"{web.url}/runs?schedule={steady}")
            wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, SLOWEST), 20, what="the schedule's trend")
            assert [r.text for r in browser.find_elements(By.CSS_SELECTOR, f"{SLOWEST} a.name")] == [steady]
            assert page_text(browser, f"{SLOWEST} .p50") == "5 s"
            assert f"schedule {steady}" in page_text(browser, "#trend-scope")
            write_runs(app, steady, [Run(timedelta(minutes=20 - n), took_s=6.0) for n in range(TREND_RUNS)], utcnow())
            wait_for(lambda: page_text(browser, f"{SLOWEST} .p50") == "6 s", 40, what="the trends' live refresh")
            assert not browser.find_elements(By.CSS_SELECTOR, "#slower tr.trend-row")  # 1.2 times: not slower
            found = violations(browser, axe)
            assert not found, said(f"/runs?schedule={steady}", width, found)
