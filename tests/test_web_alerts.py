"""The dashboard's alerts in a real browser (Debian's Chromium): the badge of open alerts on the
schedules list and on a schedule's page, the /alerts page, acknowledging an alert and silencing a
schedule's alerts after a confirmation that asks why, and sending them again."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select
from sqlalchemy import select, update

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.interfaces import alerts, service
from models import AlertSilence, AuditEvent, Schedule, transaction, utcnow
from tests.support.alert_wiring import with_ops_webhook
from tests.support.chromium import chromium, confirm, log_in, no_iso, page_text, row_of
from tests.support.helpers import wait_for
from tests.support.web_server import ADMIN, VIEWER, WebServer, text_of, xsrf

pytestmark = pytest.mark.slow
#: Markup in a step's error: shown as text, never run.
HOSTILE = "<img src=x onerror=\"document.title='owned'\"> disk full: /data"


@pytest.fixture
def settings(settings: Settings, tmp_path: Path) -> Settings:
    return with_ops_webhook(settings, tmp_path)


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    with chromium() as driver:
        yield driver


def failing_run(app: ChordbeatCelery, name: str) -> int:
    run = service.trigger_schedule(app, name)["execution_id"]
    wait_for(lambda: service.get_execution(app, run)["status"] == "failed", 30, what=f"run {run} to fail")
    return int(run)


def test_an_operator_sees_open_alerts_acknowledges_one_and_silences_a_schedule(
    app: ChordbeatCelery, worker: Any, browser: WebDriver, settings: Settings
) -> None:
    steps = [{"name": "load", "task": "chordbeat.examples.fail", "kwargs": {"message": HOSTILE}}]
    for name in ("payroll", "quiet"):
        service.apply_schedule(app, {"name": name, "cron": "0 2 * * *", "timezone": "Europe/London", "steps": steps})
    with transaction(settings.database_url) as session:
        pages = {"channels": ["ops-webhook"], "on": ["failed"]}
        session.execute(update(Schedule).where(Schedule.name == "payroll").values(alerts=pages))
    first = failing_run(app, "payroll")
    failing_run(app, "quiet")  # no alerts object: no alert, no badge
    [alert] = alerts.list_alerts(app, status="open")

    with WebServer(app) as web:
        log_in(browser, web, ADMIN)
        browser.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": "Asia/Kolkata"})
        browser.get(web.url + "/")
        assert page_text(row_of(browser, "payroll"), ".alerts-open") == "1 open alert"
        assert not row_of(browser, "quiet").find_elements(By.CSS_SELECTOR, ".alerts-open")

        # The badge leads to the schedule's open alerts: what happened, in people's times.
        row_of(browser, "payroll").find_element(By.CSS_SELECTOR, ".alerts-open").click()
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "tr.alert"), 20, what="the alerts page")
        row = browser.find_element(By.CSS_SELECTOR, "tr.alert")
        assert row.get_attribute("data-id") == alert["id"]
        assert "failed" in page_text(row, ".badge") and f"#{first}" in row.text
        assert HOSTILE in page_text(row, ".message") and browser.title != "owned"
        assert re.search(
            r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \+00:00 GMT, (\d{4}-\d\d-\d\d )?\d\d:\d\d \S+ here, ", page_text(row, "td")
        )
        assert "ops-webhook" in page_text(row, ".delivery") and "open" in page_text(row, ".open")
        no_iso(browser)

        # Acknowledge asks first and wants a reason (as Pause does); then the alert is no longer open.
        row.find_element(By.CSS_SELECTOR, ".act-ack").click()
        wait_for(lambda: browser.find_elements(By.ID, "confirm-what"), 20, what="the acknowledge confirmation")
        assert "acknowledge the failed alert of payroll" in page_text(browser, "#confirm-what")
        assert browser.find_element(By.ID, "reason").get_attribute("required") is not None
        assert alerts.list_alerts(app, status="open") != []
        confirm(browser, reason="rerunning after the disk is cleaned")
        wait_for(lambda: "acknowledged by ops" in page_text(browser, ".flash"), 20, what="the acknowledgement")
        assert page_text(browser, "#no-alerts") == "No open alerts of payroll."
        assert alerts.list_alerts(app, status="open") == []
        browser.get(web.url + "/alerts?status=all")
        assert "acknowledged by ops" in page_text(browser, ".ack")
        browser.get(web.url + "/")
        assert not row_of(browser, "payroll").find_elements(By.CSS_SELECTOR, ".alerts-open")

        # Silence from the schedule's page: how long, and why; its alerts are then kept, not sent.
        second = failing_run(app, "payroll")
        browser.get(web.url + "/schedule?name=payroll")
        assert page_text(browser, "h1 .alerts-open") == "1 open alert"
        browser.find_element(By.CSS_SELECTOR, ".act-silence").click()
        wait_for(lambda: browser.find_elements(By.ID, "hours"), 20, what="the silence confirmation")
        Select(browser.find_element(By.ID, "hours")).select_by_visible_text("4 hours")
        confirm(browser, reason="disk replacement tonight")
        wait_for(lambda: "alerts silenced for 4 hours" in page_text(browser, ".flash"), 20, what="the silence")
        said = page_text(browser, "#alert-controls")
        assert re.search(r"alerts silenced until \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \+00:00 GMT, .* in 3 h 59 min", said)
        assert "by ops · reason: disk replacement tonight" in said
        no_iso(browser)
        third = failing_run(app, "payroll")
        browser.get(web.url + "/alerts?status=silenced&schedule=payroll")
        [silenced] = browser.find_elements(By.CSS_SELECTOR, "tr.alert")
        assert f"#{third}" in silenced.text and "nowhere: silenced" in silenced.text
        assert "payroll" in page_text(browser, "#silences")

        # Sending them again acts at once, like Resume.
        browser.find_element(By.CSS_SELECTOR, "#silences .act-unsilence").click()
        wait_for(lambda: "payroll: alerts are sent again" in page_text(browser, ".flash"), 20, what="the unsilence")
        assert not browser.find_elements(By.ID, "silences")

        # A viewer sees the alerts but no buttons, and cannot act by URL either.
        log_in(browser, web, VIEWER)
        browser.get(web.url + "/alerts?status=open")
        assert f"#{second}" in page_text(browser, "tr.alert")
        assert not browser.find_elements(By.CSS_SELECTOR, ".act-ack, .act-silence, .act-unsilence")
        assert web.session(VIEWER).get(f"{web.url}/alerts/silence?name=payroll").status_code == 403

    with transaction(settings.database_url) as session:
        rows = session.scalars(select(AuditEvent).where(AuditEvent.source == "web").order_by(AuditEvent.id)).all()
        assert [(r.action.value, r.actor, r.reason) for r in rows] == [
            ("alert_acknowledged", "ops", "rerunning after the disk is cleaned"),
            ("silenced", "ops", "disk replacement tonight"),
            ("unsilenced", "ops", None),
        ]


def test_a_crafted_acknowledge_or_silence_is_refused_naming_the_field_and_changes_nothing(
    app: ChordbeatCelery, worker: Any, settings: Settings
) -> None:
    steps = [{"name": "load", "task": "chordbeat.examples.fail"}]
    service.apply_schedule(app, {"name": "payroll", "every": 3600, "steps": steps})
    with WebServer(app) as web:
        admin = web.session(ADMIN)
        token = xsrf(admin)
        for form, said in (
            ({"name": "payroll", "hours": "4"}, "reason: say why: a reason is required to silence"),
            ({"name": "payroll", "hours": "9999", "reason": "x"}, "hours: choose one of the lengths offered"),
            ({"name": "payroll", "hours": "4", "reason": "r" * 501}, "reason: must be 1 to 500 characters"),
        ):
            answer = admin.post(f"{web.url}/alerts/silence", data={**form, "_xsrf": token}, timeout=10)
            assert answer.status_code == 400 and said in text_of(answer.text), (form, text_of(answer.text))
            assert 'id="hours"' in answer.text  # the same confirmation, to correct and send again
        too_long = admin.get(f"{web.url}/alerts/acknowledge", params={"id": "x" * 401}, timeout=10)
        assert too_long.status_code == 404
        missing = admin.post(
            f"{web.url}/alerts/acknowledge", data={"id": "failed/x/y", "reason": "r", "_xsrf": token}, timeout=10
        )
        assert "acknowledge refused: alert 'failed/x/y' does not exist" in html.unescape(text_of(missing.text))
        # Without the form's token nothing is even read.
        assert admin.post(f"{web.url}/alerts/unsilence", data={"name": "payroll"}, timeout=10).status_code == 403
    with transaction(settings.database_url) as session:
        assert session.scalars(select(AlertSilence)).all() == []
        assert session.scalars(select(AuditEvent).where(AuditEvent.source == "web")).all() == []


def test_a_schedule_s_page_says_its_deadlines_alerts_and_silence_in_the_viewer_s_times(
    app: ChordbeatCelery, worker: Any, browser: WebDriver, settings: Settings
) -> None:
    steps = [{"name": "load", "task": "chordbeat.examples.fail"}]
    for name in ("nightly-hr-sync", "plain"):
        service.apply_schedule(app, {"name": name, "cron": "0 5 * * *", "timezone": "Europe/London", "steps": steps})
    with transaction(settings.database_url) as session:
        session.execute(
            update(Schedule)
            .where(Schedule.name == "nightly-hr-sync")
            .values(
                deadlines={"start_within": 900, "finish_within": 3600, "finish_by": "06:00"},
                alerts={"channels": ["ops-webhook"], "on": ["failed", "late"]},
            )
        )
    failing_run(app, "nightly-hr-sync")
    until = (utcnow() + timedelta(hours=4)).isoformat()
    alerts.silence_schedule(app, "nightly-hr-sync", until, reason="<b>LDAP</b> upgrade tonight", actor="bob")

    with WebServer(app) as web:
        log_in(browser, web, ADMIN)
        browser.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": "Asia/Kolkata"})
        browser.get(web.url + "/schedule?name=nightly-hr-sync")
        # Chromium names India's zone GMT+5:30.
        wait_for(lambda: " here" in page_text(browser, "#duties"), 20, what="the viewer's time of finish_by")
        assert re.fullmatch(
            r"Deadlines: start within 15 min, finish within 1 h, finish by 06:00 Europe/London, "
            r"(\d{4}-\d\d-\d\d )?1[01]:30 \S+ here · Alerts on failed, late → ops-webhook",
            page_text(browser, "#duties"),
        ), page_text(browser, "#duties")
        assert page_text(browser, "h1 .alerts-open") == "1 open alert"
        said = page_text(browser, "#alert-controls")
        assert re.search(
            r"alerts silenced until \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \+00:00 GMT, (\d{4}-\d\d-\d\d )?\d\d:\d\d \S+ here, "
            r"in 3 h 59 min by bob · reason: <b>LDAP</b> upgrade tonight",
            said,
        ), said
        no_iso(browser)
        browser.get(web.url + "/schedule?name=plain")
        assert not browser.find_elements(By.ID, "duties")
