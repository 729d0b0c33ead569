"""The dashboard on a phone (390 px) and a desktop (1920 px) in Chromium, as issue 38 found it:
the Alerts page's Acknowledge column cut off on a phone, the runs-by-steps grid hiding the newest
runs off-screen, states told by colour alone (and two legend states in one colour), refreshing
regions a screen reader was not told of, and a step panel Escape did not close; and the Health
page's lines, each with its age, on both."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from sqlalchemy import update

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.interfaces import service
from models import Schedule, transaction
from tests.support.chromium import chromium, log_in
from tests.support.helpers import step, wait_for
from tests.support.servers import free_port
from tests.support.web_server import ADMIN, WebServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
WIDTHS = ((390, 844), (1920, 1080))
#: Runs of one schedule: more columns than a phone shows at once.
RUNS = 12
#: Whether anything in the page's main part reaches past the window's right edge.
OVERFLOW = (
    "const d = document.documentElement; return [d.scrollWidth, d.clientWidth,"
    " [...document.querySelectorAll('main *')].filter(e => e.getBoundingClientRect().right > d.clientWidth + 1)"
    ".map(e => e.tagName + '.' + e.className).slice(-5)]"
)


@pytest.fixture
def settings(settings: Settings, tmp_path: Path) -> Settings:
    path = tmp_path / "channels.yaml"
    path.write_text("channels:\n  ops-webhook: {kind: webhook, url_env: OPS_WEBHOOK_URL, insecure: true}\n")
    # A Flower nobody answers at: the Health page links to it and says it is down.
    return dataclasses.replace(settings, alert_channels_file=str(path), flower_url=f"http://127.0.0.1:{free_port()}")


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    with chromium() as driver:
        yield driver


def visible_in_window(browser: WebDriver, element: Any) -> bool:
    return bool(
        browser.execute_script(
            "const r = arguments[0].getBoundingClientRect();"
            "return r.width > 0 && r.left >= 0 && r.right <= document.documentElement.clientWidth;",
            element,
        )
    )


def test_alerts_grid_and_step_panel_on_a_phone_and_a_desktop(
    app: ChordbeatCelery, worker: Any, browser: WebDriver, settings: Settings
) -> None:
    fails = [{"name": "load", "task": "chordbeat.examples.fail", "kwargs": {"message": "disk full: /data"}}]
    service.apply_schedule(app, {"name": "payroll", "cron": "0 2 * * *", "steps": fails})
    with transaction(settings.database_url) as session:
        alerts_on = {"channels": ["ops-webhook"], "on": ["failed"]}
        session.execute(update(Schedule).where(Schedule.name == "payroll").values(alerts=alerts_on))
    failed = service.trigger_schedule(app, "payroll")["execution_id"]
    wait_for(lambda: service.get_execution(app, failed)["status"] == "failed", 30, what="the failing run")
    service.apply_schedule(app, {"name": "hourly", "every": 3600, "overlap": "allow", "steps": [step("a"), step("b")]})
    runs = []
    for _ in range(RUNS):
        run = service.trigger_schedule(app, "hourly")["execution_id"]
        wait_for(lambda run=run: service.get_execution(app, run)["status"] == "completed", 30, what=f"run {run}")
        runs.append(run)
    newest = max(runs)

    with WebServer(app) as web:
        log_in(browser, web, ADMIN)
        for width, height in WIDTHS:
            browser.set_window_size(width, height)

            # Alerts: below 700 px each alert is a card, its Acknowledge button on the screen.
            browser.get(web.url + "/alerts")
            wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "tr.alert"), 20, what="the alerts page")
            ack = browser.find_element(By.CSS_SELECTOR, "tr.alert .act-ack")
            assert visible_in_window(browser, ack), f"Acknowledge is cut off at {width} px"
            wide = browser.execute_script(OVERFLOW)
            assert wide[0] <= wide[1], (width, wide)
            cell = browser.find_element(By.CSS_SELECTOR, "tr.alert td")
            assert cell.value_of_css_property("display") == ("block" if width < 700 else "table-cell")

            # The grid: the newest run is the first column, on the screen without scrolling sideways.
            browser.get(f"{web.url}/schedule?name=hourly")
            wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, ".grid"), 20, what="the grid")
            first = browser.find_element(By.CSS_SELECTOR, ".grid thead th:nth-child(2) a.runid")
            assert first.text == f"#{newest}"
            assert visible_in_window(browser, first), f"the newest run is off-screen at {width} px"
            assert browser.execute_script("return document.querySelector('.gridwrap').scrollLeft") == 0
            # Every cell says its state in a mark too, and the legend's states differ in colour.
            cells = browser.find_elements(By.CSS_SELECTOR, ".grid .cell")
            assert cells and all(c.text.strip() for c in cells), [c.get_attribute("outerHTML") for c in cells]
            assert all(c.get_attribute("aria-label") for c in cells)
            keys = browser.find_elements(By.CSS_SELECTOR, "#legend .key .cell")
            colours = [
                k.value_of_css_property("background-color") for k in keys if "empty" not in k.get_attribute("class")
            ]
            assert len(colours) - 1 == len(set(colours)), colours  # the "2 attempts" key repeats completed's

            # Refreshing regions are announced politely.
            for page in ("/", "/schedule?name=hourly", f"/execution/{newest}", "/health"):
                browser.get(web.url + page)
                live = browser.find_elements(By.CSS_SELECTOR, "[data-live]")
                assert live and all(e.get_attribute("aria-live") == "polite" for e in live), page

            # Health: one line per part, each with its answer's age, nothing cut off.
            browser.get(web.url + "/health")
            wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "tr.line"), 20, what="the health lines")
            lines = {e.get_attribute("data-part"): e for e in browser.find_elements(By.CSS_SELECTOR, "tr.line")}
            assert {"Database", "Redis (broker, sessions, results, RedBeat)", "Beat lock", "Flower", "Metrics"} <= set(
                lines
            ), list(lines)
            assert f"Worker {worker.hostname}" in lines and any(p.startswith("Clock of ") for p in lines)
            for part, line in lines.items():
                age = line.find_element(By.CSS_SELECTOR, ".age").text
                assert re.fullmatch(r"checked now|\d+ s ago", age), (part, age)
                assert visible_in_window(browser, line.find_element(By.CSS_SELECTOR, ".badge")), (width, part)
            flower = lines["Flower"]
            assert flower.find_element(By.LINK_TEXT, "Flower").get_attribute("href").rstrip("/") == settings.flower_url
            assert "down" in flower.text and "Connection refused" in flower.text
            wide = browser.execute_script(OVERFLOW)
            assert wide[0] <= wide[1], (width, wide)

            # Escape closes the step panel and gives the focus back to the cell that opened it.
            browser.get(f"{web.url}/schedule?name=hourly")
            opener = browser.find_element(By.CSS_SELECTOR, ".grid a.cell")
            opener.click()
            panel = browser.find_element(By.ID, "detail")
            wait_for(panel.is_displayed, 20, what="the step panel")
            browser.switch_to.active_element.send_keys(Keys.ESCAPE)
            wait_for(lambda panel=panel: not panel.is_displayed(), 20, what="Escape to close the panel")
            assert browser.switch_to.active_element == opener
