"""The dashboard's next fire times in a real browser (Debian's Chromium): slots a schedule's
business calendar excludes say that they will not run, and why."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from urllib.parse import quote
from zoneinfo import ZoneInfo

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.interfaces import service
from tests.support.chromium import chromium, log_in
from tests.support.helpers import wait_for
from tests.support.web_server import ADMIN, WebServer

pytestmark = pytest.mark.slow


@pytest.fixture
def settings(settings: Settings, tmp_path: Path) -> Settings:
    directory = tmp_path / "calendars"
    directory.mkdir()
    return dataclasses.replace(settings, calendars_dir=str(directory))


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    with chromium() as driver:
        yield driver


def test_the_schedule_page_marks_excluded_fire_times_with_the_reason(
    app: ChordbeatCelery, browser: WebDriver, settings: Settings
) -> None:
    zone = ZoneInfo("Europe/London")
    now = datetime.now(zone)
    first = now.date() if now.hour < 18 else now.date() + timedelta(days=1)
    assert settings.calendars_dir is not None
    (Path(settings.calendars_dir) / "uk").write_text(f"{(first + timedelta(days=3)).isoformat()}  # a holiday\n")
    calendar = {"exclude": [(first + timedelta(days=1)).isoformat()], "calendars": ["uk"]}
    steps = [{"name": "pay", "task": "chordbeat.examples.sleep"}]
    definition = {"name": "payroll", "cron": "0 18 * * *", "timezone": "Europe/London", "steps": steps}
    service.apply_schedule(app, {**definition, "calendar": calendar})
    with WebServer(app) as web:
        log_in(browser, web, ADMIN)
        browser.get(f"{web.url}/schedule?name={quote('payroll')}")
        items = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "ol.upcoming li"), 20, what="the next fires")
        assert isinstance(items, list) and len(items) == 10
        marks = [item.find_elements(By.CSS_SELECTOR, ".excluded") for item in items]
        said = [mark[0].text if mark else None for mark in marks]
        assert said == [
            None,
            "not run: excluded by the schedule's calendar.exclude",
            None,
            "not run: in calendar 'uk'",
            *[None] * 6,
        ], said
