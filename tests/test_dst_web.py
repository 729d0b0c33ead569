"""The dashboard's next fire times in a real browser (Debian's Chromium): on a day the clocks
change, a fire time says what the schedule's DST rule did to it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from urllib.parse import quote

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from sqlalchemy import update

from celeryapp.application import ChordbeatCelery
from celeryapp.interfaces import service
from models import Schedule, transaction
from tests.support.chromium import chromium, log_in
from tests.support.helpers import wait_for
from tests.support.web_server import ADMIN, WebServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    with chromium() as driver:
        yield driver


def test_the_schedule_page_says_the_dst_rule_on_transition_days(app: ChordbeatCelery, browser: WebDriver) -> None:
    steps = [{"name": "load", "task": "chordbeat.examples.sleep"}]
    definition = {"name": "nightly", "cron": "30 1 * * *", "timezone": "Europe/London", "steps": steps}
    service.apply_schedule(app, {**definition, "dst": {"repeated": "last"}})
    # The preview starts at the stored next run: the day before London's clocks go back.
    with transaction(app.settings.database_url) as session:
        first = datetime(2026, 10, 24, 0, 30, tzinfo=UTC)
        session.execute(update(Schedule).where(Schedule.name == "nightly").values(next_run_at=first))
    with WebServer(app) as web:
        log_in(browser, web, ADMIN)
        browser.get(f"{web.url}/schedule?name={quote('nightly')}")
        items = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "ol.upcoming li"), 20, what="the next fires")
        assert isinstance(items, list) and len(items) == 10
        notes = [item.find_elements(By.CSS_SELECTOR, ".dst") for item in items]
        said = [note[0].text if note else None for note in notes]
        assert said == [
            None,
            "01:30 happens twice on 2026-10-25; runs once, in the second pass (dst.repeated: last)",
            *[None] * 8,
        ], said
        assert all(note[0].is_displayed() for note in notes if note)
