"""An operator's eight first-day questions, each answered from the dashboard in one page view,
read off the page in Debian's Chromium the way a person reads it (issue 38): is everything
healthy; what failed in the last 24 h and why; what is running and for how long; what runs next,
in my zone; which schedule is slowest and is it getting slower; did last night's 02:00 run happen
and if not why; who changed what today; is any alert unacknowledged."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from sqlalchemy import update

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.domain.durations import TREND_RUNS
from celeryapp.interfaces import service
from celeryapp.worker import firing
from models import Schedule, Trigger, transaction, utcnow
from tests.support.alert_wiring import with_ops_webhook
from tests.support.chromium import chromium, log_in, no_iso, page_text
from tests.support.helpers import wait_for
from tests.support.run_history import hourly, write_runs
from tests.support.web_server import ADMIN, WebServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
LONDON, NEW_YORK, KOLKATA = ZoneInfo("Europe/London"), ZoneInfo("America/New_York"), ZoneInfo("Asia/Kolkata")


@pytest.fixture
def settings(settings: Settings, tmp_path: Path) -> Settings:
    return with_ops_webhook(settings, tmp_path)


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    with chromium() as driver:
        yield driver


def last_night_at_two(now: datetime) -> datetime:
    """The latest 02:00 in London before ``now``."""
    local = now.astimezone(LONDON)
    two = local.replace(hour=2, minute=0, second=0, microsecond=0)
    return two if two <= local else two - timedelta(days=1)


def next_at(now: datetime, zone: ZoneInfo, hour: int, minute: int) -> datetime:
    """The next ``hour``:``minute`` in ``zone`` after ``now``."""
    local = now.astimezone(zone)
    at = local.replace(hour=hour, minute=minute, second=0, microsecond=0)
    return at if at > local else (local + timedelta(days=1)).replace(hour=hour, minute=minute, second=0, microsecond=0)


def people_time(at: datetime, zone: ZoneInfo) -> str:
    """``at`` as the dashboard writes a time in a schedule's zone: ``2026-11-28 02:00:00 +00:00 GMT``."""
    local = at.astimezone(zone)
    offset = local.strftime("%z")
    return f"{local:%Y-%m-%d %H:%M:%S} {offset[:3]}:{offset[3:]} {local.tzname()}"


def kolkata(at: datetime) -> str:
    return at.astimezone(KOLKATA).strftime("%H:%M")


def rows_of(browser: WebDriver, selector: str) -> list[str]:
    return [row.text for row in browser.find_elements(By.CSS_SELECTOR, selector)]


def one_view(browser: WebDriver, url: str, ready: str) -> None:
    """Open ``url`` and wait until ``ready`` shows: the one page view a question gets."""
    browser.get(url)
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, ready), 20, what=f"{ready} on {url}")


def test_each_first_day_question_is_answered_by_one_page_view(
    app: ChordbeatCelery, worker: Any, browser: WebDriver, settings: Settings
) -> None:
    now = utcnow()
    step = {"name": "load", "task": "chordbeat.examples.sleep", "kwargs": {"seconds": 0.1}}
    fails = {"name": "load", "task": "chordbeat.examples.fail", "kwargs": {"message": "disk full: /data"}}
    waits = {"name": "export", "task": "chordbeat.examples.sleep", "kwargs": {"seconds": 120}}
    for definition in (
        {"name": "nightly", "cron": "0 2 * * *", "timezone": "Europe/London", "steps": [step]},
        {"name": "breaks", "every": 3600, "steps": [fails], "alerts": {"channels": ["ops-webhook"], "on": ["failed"]}},
        {"name": "long", "every": 3600, "steps": [waits]},
        {"name": "reports", "cron": "30 6 * * *", "timezone": "America/New_York", "steps": [step]},
        {"name": "etl", "cron": "0 * * * *", "steps": [step]},
        {"name": "quick", "cron": "0 * * * *", "steps": [step]},
    ):
        service.apply_schedule(app, definition)
    with transaction(settings.database_url) as session:
        # nightly has existed for a week: its 02:00 last night came after it was made.
        session.execute(update(Schedule).where(Schedule.name == "nightly").values(created_at=now - timedelta(days=7)))
    # Frozen for quarter-end by alice, then beat's fire of 02:00 found it paused.
    service.pause_schedule(app, "nightly", actor="alice", reason="quarter-end freeze")
    two = last_night_at_two(now)
    firing.fire(app, "nightly", nominal_at=two, trigger=Trigger.CRON)
    # etl has got slower (1 min 40 s against 1 min); quick takes 5 s.
    write_runs(app, "etl", hourly([60.0] * TREND_RUNS + [100.0] * TREND_RUNS), now)
    write_runs(app, "quick", hourly([5.0] * 2 * TREND_RUNS), now)
    failed = service.trigger_schedule(app, "breaks")["execution_id"]
    wait_for(lambda: service.get_execution(app, failed)["status"] == "failed", 30, what="breaks to fail")
    running = service.trigger_schedule(app, "long")["execution_id"]
    wait_for(lambda: service.get_execution(app, running)["tasks"][0]["status"] == "processing", 30, what="export")

    try:
        read_the_answers(browser, app, failed, two)
    finally:
        service.cancel_execution(app, running, reason="the test is over")


def read_the_answers(browser: WebDriver, app: ChordbeatCelery, failed: int, two: datetime) -> None:
    with WebServer(app) as web:
        log_in(browser, web, ADMIN)
        browser.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": "Asia/Kolkata"})

        # 1. Is everything healthy? One line per part, each with its state and its answer's age.
        one_view(browser, web.url + "/health", "#health-lines tr.line")
        lines = {
            row.get_attribute("data-part"): (row.get_attribute("data-state"), row.text)
            for row in browser.find_elements(By.CSS_SELECTOR, "#health-lines tr.line")
        }
        assert lines["Database"][0] == "up" and "answers (round trip" in lines["Database"][1]
        assert any((part or "").startswith("Redis") and state == "up" for part, (state, _) in lines.items()), lines
        # No beat runs in this test: the page says so, and what it means.
        assert "no beat holds the lock: nothing fires schedules" in " ".join(text for _, text in lines.values())
        assert all(re.search(r"(checked now|\d+ s ago|\d+ min ago)", text) for _, text in lines.values()), lines

        # 2. What failed in the last 24 h, and why?
        one_view(browser, web.url + "/runs?state=failed&since=24h", "tr.run-row")
        [failure] = rows_of(browser, "tr.run-row")
        assert "breaks" in failure and "disk full: /data" in failure

        # 3. What is running, and for how long?
        one_view(browser, web.url + "/runs?state=in_progress", "tr.run-row")
        [active] = rows_of(browser, "tr.run-row")
        assert "long" in active and re.search(r"\d+(\.\d)? s so far", active), active

        # 4. What runs next, in my zone? (The viewer is in Kolkata.)
        one_view(browser, web.url + "/", "tr")
        reports = browser.find_element(By.XPATH, "//tr[.//a[text()='reports']]").text
        due = next_at(utcnow(), NEW_YORK, 6, 30)
        clock = re.escape(people_time(due, NEW_YORK).split(" ", 1)[1])  # today's or tomorrow's
        assert re.search(rf"{clock}, (\d{{4}}-\d\d-\d\d )?{kolkata(due)} \S+ here, in ", reports), reports

        # 5. Which schedule is slowest, and is it getting slower?
        one_view(browser, web.url + "/runs", "#slowest tr.trend-row")
        slowest = browser.find_elements(By.CSS_SELECTOR, "#slowest tr.trend-row")
        assert slowest[0].find_element(By.CSS_SELECTOR, "a.name").text == "etl"
        assert page_text(slowest[0], ".p50") == "1 min 40 s"
        slower = [
            r.find_element(By.CSS_SELECTOR, "a.name").text
            for r in browser.find_elements(By.CSS_SELECTOR, "#slower tr.trend-row")
        ]
        assert slower == ["etl"]

        # 6. Did last night's 02:00 run happen, and if not, why?
        one_view(browser, web.url + "/schedule?name=nightly", "table.slots tbody tr")
        [slot] = rows_of(browser, "table.slots tbody tr")
        assert re.match(rf"{re.escape(people_time(two, LONDON))}, {kolkata(two)} \S+ here, ", slot), slot
        assert "skipped: paused" in slot and "schedule is paused" in slot, slot
        assert "before the schedule existed" not in slot

        # 7. Who changed what today?
        one_view(browser, web.url + "/audit", "tr.audit-row")
        changes = [
            (r.find_element(By.CSS_SELECTOR, ".actor").text, r.find_element(By.CSS_SELECTOR, ".action").text, r.text)
            for r in browser.find_elements(By.CSS_SELECTOR, "tr.audit-row")
        ]
        [pause] = [c for c in changes if c[1] == "pause"]
        assert pause[0] == "alice" and "nightly" in pause[2] and "quarter-end freeze" in pause[2]

        # 8. Is any alert unacknowledged?
        one_view(browser, web.url + "/alerts", "tr.alert")
        [alert] = rows_of(browser, "tr.alert")
        assert "breaks" in alert and "failed" in alert and f"#{failed}" in alert and "open" in alert
        no_iso(browser)
