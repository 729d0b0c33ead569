"""The Limits pages in a real browser (Debian's Chromium) at a phone's and a desktop's width: each
limit with its slots, what is in use, who waits and for how long; a limit's holders with links to
their runs, its waiters, the slots each key holds; an admin's resize with a reason, audited, that
admits a waiter at once; and a viewer who only reads (no form, and a POST refused)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from datetime import timedelta

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from celeryapp.application import ChordbeatCelery
from celeryapp.execution.limit_slots import Demand, Holder, acquire_or_wait
from celeryapp.interfaces import limit_service, service
from models import ExecutionStatus, transaction, utcnow
from tests.support.axe import AXE, said, violations
from tests.support.chromium import chromium, log_in, no_iso, nothing_wider_than_the_window, page_text
from tests.support.helpers import step, wait_for
from tests.support.run_history import Run, define, write_runs
from tests.support.web_server import ADMIN, VIEWER, WebServer, text_of, xsrf

pytestmark = pytest.mark.slow
#: Worker task ids of the holds made here: far from the real steps' (a hold is an attempt's).
FAKE_TASKS = 1_000_000


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    with chromium() as driver:
        yield driver


def occupy(app: ChordbeatCelery, limit: str, run: int, step: str, key: str = "") -> bool:
    """A hold (or a wait) of run ``run``'s step, by a worker task id no real step has."""
    with transaction(app.settings.database_url) as session:
        return acquire_or_wait(session, [Demand(limit, key)], Holder(FAKE_TASKS + run, 1, run, step))[0]


@pytest.mark.timeout(180)
def test_limits_pages_at_390_and_1920_px_and_an_admin_resizes_with_a_reason(
    app: ChordbeatCelery, browser: WebDriver
) -> None:
    if not AXE.exists():
        pytest.fail(f"{AXE} is missing: make test's set-up (AXE_STAMP) installs axe-core")
    axe = AXE.read_text()
    define(app, "exports")
    runs = write_runs(
        app, "exports", [Run(timedelta(minutes=m), status=ExecutionStatus.IN_PROGRESS) for m in (9, 8, 7)], utcnow()
    )
    limit_service.apply_limit(app, {"name": "erp", "slots": 1, "max_wait": 600})
    key = "{payload.customer}"
    limit_service.apply_limit(app, {"name": "warehouse", "slots": 3, "rate": "60/min", "key": key, "per_key_slots": 2})
    assert occupy(app, "erp", runs[0], "export stock")
    assert not occupy(app, "erp", runs[1], "export orders")
    assert occupy(app, "warehouse", runs[2], "load ledger", key="acme")

    with WebServer(app) as web:
        log_in(browser, web, ADMIN)
        for width, height in ((1920, 1080), (390, 844)):
            browser.set_window_size(width, height)
            browser.get(web.url + "/")
            browser.find_element(By.LINK_TEXT, "Limits").click()  # in the navigation
            wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "tr.limit"), 20, what="the limits")
            erp = browser.find_element(By.CSS_SELECTOR, "tr.limit[data-name='erp']")
            assert (page_text(erp, ".in-use"), page_text(erp, ".waiting")) == ("1 full", "1")
            assert re.fullmatch(r"\d+(\.\d)? s|\d+ min( \d+ s)?", page_text(erp, ".oldest")), page_text(erp, ".oldest")
            warehouse = browser.find_element(By.CSS_SELECTOR, "tr.limit[data-name='warehouse']")
            assert page_text(warehouse, ".waiting") == "0" and page_text(warehouse, ".oldest") == "-"
            assert "rate 60/min · key {payload.customer}, 2 per key" in warehouse.text
            found = violations(browser, axe)
            assert not found, said("/limits", width, found)
            nothing_wider_than_the_window(browser)
            if width == 390:  # stacked into cards
                assert (
                    browser.execute_script("return getComputedStyle(document.querySelector('tr.limit td')).display")
                    == "block"
                )
            if folder := os.environ.get("CHORDBEAT_WEB_SCREENSHOTS"):
                browser.save_screenshot(os.path.join(folder, f"dashboard-limits-{width}.png"))

            browser.find_element(By.LINK_TEXT, "warehouse").click()
            wait_for(lambda: browser.find_elements(By.ID, "keys"), 20, what="the warehouse's page")
            assert re.search(r"acme\s*(In use: )?1 of 2", page_text(browser, "#keys")), page_text(browser, "#keys")
            found = violations(browser, axe)
            assert not found, said("/limit?name=warehouse", width, found)

            browser.get(web.url + "/limits")
            browser.find_element(By.LINK_TEXT, "erp").click()
            wait_for(lambda: browser.find_elements(By.ID, "holders"), 20, what="the erp's page")
            assert "1 of 1 slots in use · 1 waiting · the oldest for" in page_text(browser, "#limit-use")
            holder = browser.find_element(By.CSS_SELECTOR, "#holders tr.entry")
            assert holder.find_element(By.TAG_NAME, "a").get_attribute("href") == f"{web.url}/execution/{runs[0]}"
            assert "export stock" in holder.text and "export orders" in page_text(browser, "#waiters")
            no_iso(browser)
            found = violations(browser, axe)
            assert not found, said("/limit?name=erp", width, found)
            nothing_wider_than_the_window(browser)
            if folder := os.environ.get("CHORDBEAT_WEB_SCREENSHOTS"):
                browser.save_screenshot(os.path.join(folder, f"dashboard-limit-{width}.png"))

        # A step waiting for the limit says, on its run's page, what it waits for and who holds it.
        service.apply_schedule(app, {"name": "stock", "every": 3600, "steps": [step("count", uses=["erp"])]})
        waiting = service.trigger_schedule(app, "stock")["execution_id"]
        browser.get(f"{web.url}/execution/{waiting}")
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, ".waiting-for"), 20, what="the waiting step")
        assert page_text(browser, ".waiting-for") == f"waiting for erp 1/1 (held by #{runs[0]} export stock)"
        assert service.cancel_execution(app, waiting)["status"] == "cancelled"  # its wait goes with it
        browser.get(f"{web.url}/limit?name=erp")
        wait_for(lambda: browser.find_elements(By.ID, "holders"), 20, what="the erp's page")

        # A mistake is said on the page, naming the field, what was typed kept; nothing changes.
        slots = browser.find_element(By.ID, "slots")
        slots.clear()
        slots.send_keys("20000")
        browser.execute_script("document.getElementById('slots').removeAttribute('max')")  # as a script could
        browser.find_element(By.ID, "reason").send_keys("more exports")
        browser.find_element(By.ID, "resize-button").click()
        wait_for(lambda: browser.find_elements(By.ID, "resize-error"), 20, what="the refusal")
        assert page_text(browser, "#resize-error").startswith("slots: must be between 1 and 10000")
        assert browser.find_element(By.ID, "reason").get_attribute("value") == "more exports"
        assert [r for r in service.list_audit(app) if r["source"] == "web"] == [], "nothing changed"

        # Made larger, the waiter is admitted in the same transaction. These rows stand for steps
        # and have no task to send, so the admitted one gives its slot straight back as a waiter
        # whose run ended does (a real waiting step runs: test_limit_steps); the holder stays.
        slots = browser.find_element(By.ID, "slots")
        slots.clear()
        slots.send_keys("2")
        browser.find_element(By.ID, "resize-button").click()
        wait_for(lambda: "erp: 1 → 2 slots, 1 in use" in page_text(browser, "body"), 20, what="the flash")
        assert "1 of 2 slots in use · 0 waiting" in page_text(browser, "#limit-use")
        assert "export stock" in page_text(browser, "#holders")
        resized = [r for r in service.list_audit(app) if r["action"] == "limit_applied" and r["source"] == "web"]
        assert [(r["actor"], r["reason"], r["detail"]["definition"]["slots"]) for r in resized] == [
            ("ops", "more exports", 2)
        ]

        # A viewer reads, and may not act: no form, and a POST (with its CSRF token) refused.
        viewer = web.session(VIEWER)
        page = viewer.get(f"{web.url}/limit?name=erp", timeout=10)
        assert page.status_code == 200 and 'id="resize"' not in page.text and "export stock" in text_of(page.text)
        refused = viewer.post(
            f"{web.url}/limit", data={"name": "erp", "slots": "9", "reason": "x", "_xsrf": xsrf(viewer)}, timeout=10
        )
        assert refused.status_code == 403
        admin = web.session(ADMIN)
        forged = admin.post(f"{web.url}/limit", data={"name": "erp", "slots": "9", "reason": "x"}, timeout=10)
        assert forged.status_code == 403, "no CSRF token, no action"
        blank = admin.post(f"{web.url}/limit", data={"name": "erp", "slots": "9", "_xsrf": xsrf(admin)}, timeout=10)
        assert blank.status_code == 400 and "reason: say why" in text_of(blank.text)
        assert admin.get(f"{web.url}/limit?name=nope", timeout=10).status_code == 404
        assert limit_service.get_limit(app, "erp")["slots"] == 2
