"""The dashboard's Audit page in a real browser (Debian's Chromium) at a phone's and a desktop's
width: rows from the CLI (a file apply, which names no schedule), another service (with the source
its message claimed, shown as a claim), the dashboard and beat, filtered by actor, action, schedule
and time, newest first, paged by cursor, each filtered page an address another person can open."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlparse
from zoneinfo import ZoneInfo

import pytest
import yaml
from celery import Celery
from click.testing import CliRunner
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.contract import SOURCE_HEADER
from celeryapp.domain.times import iso
from celeryapp.interfaces.cli import main
from models import AuditAction, AuditSource, transaction, utcnow
from models.audit import BEAT, record_audit
from tests.support.chromium import chromium, log_in, no_iso, page_text
from tests.support.helpers import step, wait_for
from tests.support.web_server import ADMIN, WebServer, xsrf

pytestmark = pytest.mark.slow
#: Rows of one actor past a page (the page shows 50).
BULK = 55


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    with chromium() as driver:
        yield driver


def rows(browser: WebDriver) -> list[tuple[str, str]]:
    """(actor, action) of each row shown, top to bottom."""
    return [
        (r.find_element(By.CSS_SELECTOR, ".actor").text, r.find_element(By.CSS_SELECTOR, ".action").text)
        for r in browser.find_elements(By.CSS_SELECTOR, "tr.audit-row")
    ]


def row_by(browser: WebDriver, source: str) -> Any:
    return browser.find_element(By.CSS_SELECTOR, f"tr.audit-row[data-source='{source}']")


def open_page(browser: WebDriver, url: str) -> None:
    browser.get(url)
    wait_for(lambda: browser.find_elements(By.ID, "audit-filters"), 20, what="the audit page")


@pytest.mark.timeout(120)  # two widths in Chromium beside a worker: past 30 s on a loaded run
def test_an_operator_finds_who_changed_what_on_the_audit_page_at_390_and_1920_px(
    app: ChordbeatCelery, worker: Any, client: Celery, browser: WebDriver, settings: Settings, tmp_path: Path
) -> None:
    # Beat's own decision two days ago (outside "last 24 hours"): a run it timed out.
    with transaction(settings.database_url) as session:
        BEAT.record(
            session, AuditAction.TIMED_OUT, "payroll", execution_id=7, reason="gone", at=utcnow() - timedelta(days=2)
        )
    # The CLI applies a file: one row of source cli naming no schedule.
    path = tmp_path / "ops.yaml"
    path.write_text(yaml.safe_dump({"schedules": [{"name": "payroll", "cron": "0 2 * * *", "steps": [step("s")]}]}))
    applied = CliRunner().invoke(main, ["apply", "--as", "alice", "--reason", "release 42", str(path)])
    assert applied.exit_code == 0, applied.output
    # Another service pauses it, its message claiming to be the CLI.
    client.send_task(
        "chordbeat.pause_schedule", kwargs={"name": "payroll", "actor": "root@bastion"}, headers={SOURCE_HEADER: "cli"}
    ).get(timeout=20)
    # A bulk of rows past one page.
    with transaction(settings.database_url) as session:
        for n in range(BULK):
            record_audit(
                session,
                actor="bulk",
                source=AuditSource.WEB,
                action=AuditAction.TRIGGER,
                schedule_name=None,
                reason=f"bulk {n}",
            )

    with WebServer(app) as web:
        # The dashboard resumes it: a row of source web.
        admin = web.session(ADMIN)
        resumed = admin.post(
            web.url + "/act/resume", data={"name": "payroll", "reason": "done", "_xsrf": xsrf(admin)}, timeout=10
        )
        assert resumed.status_code == 200, resumed.text
        log_in(browser, web, ADMIN)
        browser.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": "Asia/Kolkata"})
        for width, height in ((1920, 1080), (390, 844)):
            browser.set_window_size(width, height)
            browser.get(web.url + "/")
            browser.find_element(By.LINK_TEXT, "Audit").click()  # linked from the navigation
            wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "tr.audit-row"), 20, what="the audit rows")
            # Newest first, a page of 50; every source there, each said as it is.
            shown = rows(browser)
            assert len(shown) == 50 and shown[0] == ("ops", "resume"), shown
            browser.find_element(By.ID, "audit-older").click()
            wait_for(lambda: ("root@bastion", "pause") in rows(browser), 20, what="the older page")
            assert rows(browser) == [("bulk", "trigger")] * (BULK - 49) + [
                ("root@bastion", "pause"),
                ("alice", "file applied"),
                ("chordbeat", "timed out"),
            ], rows(browser)
            service_row = row_by(browser, "service")
            assert page_text(service_row, ".source") == "(service, claims cli)"
            assert "not verified" in service_row.find_element(By.CSS_SELECTOR, ".claimed").get_attribute("title")
            assert service_row.find_element(By.LINK_TEXT, "payroll").get_attribute("href").endswith("name=payroll")
            beat_row = row_by(browser, "beat")
            assert beat_row.find_element(By.LINK_TEXT, "#7").get_attribute("href").endswith("/execution/7")
            file_row = row_by(browser, "cli")
            assert f"file {path}" in file_row.text and "release 42" in file_row.text
            assert not file_row.find_elements(By.CSS_SELECTOR, "a.name")  # no schedule to link to
            # From 18:30 UTC on it is already the next day in Kolkata: the "here" part says its date.
            here = r"\d\d:\d\d:\d\d \+00:00 UTC, (\d{4}-\d\d-\d\d )?\d\d:\d\d \S+ here, 2 d"
            assert re.search(here, row_by(browser, "beat").text), row_by(browser, "beat").text
            no_iso(browser)
            if folder := os.environ.get("CHORDBEAT_WEB_SCREENSHOTS"):
                browser.save_screenshot(os.path.join(folder, f"dashboard-audit-{width}.png"))
            # Nothing wider than the window: at 390 px the rows are stacked into cards.
            wide = browser.execute_script(
                "const d = document.documentElement; return [d.scrollWidth, d.clientWidth,"
                " [...document.querySelectorAll('main *')].filter(e => e.getBoundingClientRect().right > d.clientWidth)"
                ".map(e => e.tagName + '.' + e.className + ':' + e.textContent.slice(0, 40)).slice(-5)]"
            )
            assert wide[0] <= wide[1], wide
            if width == 390:
                assert service_row.find_element(By.CSS_SELECTOR, "td").value_of_css_property("display") == "block"

            # Filters: who, then what, then when; each answer is an address to send on.
            open_page(browser, web.url + "/audit")
            browser.find_element(By.NAME, "actor").send_keys("alice")
            browser.find_element(By.CSS_SELECTOR, "#audit-filters button").click()
            wait_for(lambda: "actor=alice" in browser.current_url, 20, what="the actor filter")
            assert rows(browser) == [("alice", "file applied")]
            open_page(browser, web.url + "/audit")
            Select(browser.find_element(By.NAME, "action")).select_by_value("pause")
            browser.find_element(By.NAME, "schedule").send_keys("payroll")
            browser.find_element(By.CSS_SELECTOR, "#audit-filters button").click()
            wait_for(lambda: "action=pause" in browser.current_url, 20, what="the action filter")
            shared = browser.current_url
            assert parse_qs(urlparse(shared).query) == {"action": ["pause"], "schedule": ["payroll"]}
            assert rows(browser) == [("root@bastion", "pause")]
            open_page(browser, web.url + "/audit?schedule=payroll")
            Select(browser.find_element(By.NAME, "since")).select_by_value("24h")
            browser.find_element(By.CSS_SELECTOR, "#audit-filters button").click()
            wait_for(lambda: "since=24h" in browser.current_url, 20, what="the time filter")
            assert rows(browser) == [("ops", "resume"), ("root@bastion", "pause")]
            # The shared address shows the same rows to whoever opens it, filters kept in the form.
            log_in(browser, web, ADMIN)
            open_page(browser, shared)
            assert rows(browser) == [("root@bastion", "pause")]
            assert Select(browser.find_element(By.NAME, "action")).first_selected_option.text == "pause"
            # A page of one actor keeps the filter into the older page.
            open_page(browser, web.url + "/audit?actor=bulk")
            assert len(rows(browser)) == 50
            browser.find_element(By.ID, "audit-older").click()
            wait_for(lambda: "before=" in browser.current_url, 20, what="the older page")
            assert rows(browser) == [("bulk", "trigger")] * 5 and "actor=bulk" in browser.current_url
            # A time range from the address, said in people's times.
            window = {"since": iso(utcnow() - timedelta(days=3)), "until": iso(utcnow() - timedelta(days=1))}
            open_page(browser, web.url + "/audit?" + urlencode(window))
            assert rows(browser) == [("chordbeat", "timed out")]
            assert re.search(r"from \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \+00:00 UTC", page_text(browser, "#audit-range"))
            no_iso(browser)
            # The form's own from and to: wall times in the viewer's zone (Kolkata, UTC+05:30). Read
            # as UTC, this "from" would be 5.5 h later and leave beat's row of 2 days ago out.
            kolkata = ZoneInfo("Asia/Kolkata")
            start = (utcnow() - timedelta(days=2, hours=1)).astimezone(kolkata).strftime("%Y-%m-%dT%H:%M:%S")
            end = (utcnow() - timedelta(days=1)).astimezone(kolkata).strftime("%Y-%m-%dT%H:%M:%S")
            open_page(browser, web.url + "/audit")
            zone = browser.execute_script("return Intl.DateTimeFormat().resolvedOptions().timeZone")
            assert zone in {"Asia/Kolkata", "Asia/Calcutta"} and page_text(browser, "#audit-filters .zone-said") == zone
            browser.execute_script(
                "document.getElementById('audit-from').value = arguments[0];"
                "document.getElementById('audit-to').value = arguments[1];",
                start,
                end,
            )
            browser.find_element(By.CSS_SELECTOR, "#audit-filters button").click()
            wait_for(lambda: "from=" in browser.current_url, 20, what="the from/to filter")
            assert parse_qs(urlparse(browser.current_url).query)["zone"] == [zone]
            assert rows(browser) == [("chordbeat", "timed out")]
            assert browser.find_element(By.ID, "audit-from").get_attribute("value") == start  # kept in the form
            assert re.search(r"from \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \+00:00 UTC", page_text(browser, "#audit-range"))
            # Bad values are refused naming the field.
            open_page(browser, web.url + "/audit?" + urlencode({"from": "yesterday", "zone": "Asia/Kolkata"}))
            assert page_text(browser, "#audit-refused").startswith("from: is not a date and time"), page_text(
                browser, "#audit-refused"
            )
            open_page(browser, web.url + "/audit?" + urlencode({"from": end, "to": start, "zone": "Asia/Kolkata"}))
            assert page_text(browser, "#audit-refused") == "to: must be after from"
            open_page(browser, web.url + "/audit?" + urlencode({"to": end, "zone": "Mars/Olympus"}))
            assert page_text(browser, "#audit-refused").startswith("zone: is not a time zone name")
            # A hostile filter is refused naming the field, not run.
            open_page(browser, web.url + "/audit?action=P%D0%B0use&since=2026-11-28T06:00:00")
            assert page_text(browser, "#audit-refused").startswith("action: must be one of apply")
            assert not browser.find_elements(By.CSS_SELECTOR, "tr.audit-row")
            open_page(browser, web.url + "/audit?actor=bulk&before=%D9%A1%D9%A2")  # Arabic-Indic digits
            assert page_text(browser, "#audit-refused").startswith("before: must be an audit row id (digits)")
