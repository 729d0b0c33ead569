"""The dashboard's backfills over HTTP with a real worker: the schedule page's form, the dry-run
page (slots listed, nothing started), the confirmation (CSRF, admins only, actor and source web),
the progress panel with catch-ups, cancel after asking, the run's slot on its page, and the
schedule's catch-up, calendar and DST rules in words."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode
from zoneinfo import ZoneInfo

import pytest

from celeryapp.application import ChordbeatCelery
from celeryapp.execution.backfills import create_backfill
from celeryapp.interfaces import backfill_service, service
from models import BackfillOrigin, Schedule, transaction, utcnow
from tests.support.servers import wait_for
from tests.support.web_server import ADMIN, VIEWER, WebServer, text_of, xsrf

pytestmark = pytest.mark.both_databases
LONDON = ZoneInfo("Europe/London")


@pytest.fixture
def web(app: ChordbeatCelery) -> Iterator[WebServer]:
    with WebServer(app) as server:
        yield server


def _nightly(app: ChordbeatCelery, name: str, seconds: float = 0.05, **fields: Any) -> None:
    steps = [{"name": "s", "task": "chordbeat.examples.sleep", "kwargs": {"seconds": seconds}}]
    service.apply_schedule(
        app, {"name": name, "cron": "0 2 * * *", "timezone": "Europe/London", "steps": steps, **fields}
    )


def _london_midnight(days_ago: int) -> str:
    """A ``datetime-local`` value: London's wall time, as the form sends it."""
    day = datetime.now(LONDON).date() - timedelta(days=days_ago)
    return f"{day:%Y-%m-%d}T00:00"


def test_backfill_from_the_schedule_page_lists_asks_starts_and_shows_progress(
    app: ChordbeatCelery, web: WebServer, worker: Any
) -> None:
    _nightly(app, "nightly")
    viewer, admin = web.session(VIEWER), web.session(ADMIN)
    request = {"name": "nightly", "from": _london_midnight(25), "to": _london_midnight(0), "mode": "missing"}
    query = urlencode({**request, "max_concurrent": "1"})
    assert viewer.get(web.url + f"/act/backfill?{query}", timeout=10).status_code == 403

    # The dry run: 25 slots, 20 listed, nothing started.
    r = admin.get(web.url + f"/act/backfill?{query}", timeout=10)
    shown = text_of(r.text)
    assert r.status_code == 200 and "This will start 25 runs of nightly, oldest first, one at a time" in shown, shown
    assert len(re.findall(r"<li><span class=\"when\">", r.text)) == 20 and "… and 5 more" in shown
    assert backfill_service.list_backfills(app, "nightly") == []
    for bad, said in (
        ({"max_concurrent": "0"}, "max_concurrent: must be a whole number from 1 to 100, got 0"),
        ({"max_concurrent": "two"}, "max_concurrent: must be a whole number from 1 to 100, got &#x27;two&#x27;"),
        ({"from": "yesterday"}, "start: is not a date and time"),
        ({"from": _london_midnight(0), "to": _london_midnight(1)}, "end: "),
        ({"mode": "some"}, "mode: must be one of missing, failed, all"),
        (
            {"from": "<b>" + "9" * 5000},
            "start: is not a date and time (2026-11-20 02:00, 24-hour, or ISO 8601), got &#x27;&lt;b&gt;99",
        ),
        ({"from": "2026-02-30T02:00"}, "start: is not a date and time"),
    ):
        r = admin.get(web.url + "/act/backfill?" + urlencode({**request, "max_concurrent": "1", **bad}), timeout=10)
        assert r.status_code == 400 and said in r.text and 'id="confirm"' not in r.text, (bad, text_of(r.text))

    for name in ("<script>x</script>", "nope\x00", "n" * 5000):
        r = admin.get(web.url + "/act/backfill?" + urlencode({**request, "name": name}), timeout=10)
        assert r.status_code == 404 and "<script>x" not in r.text, name
    # Hourly over two years: more slots than one backfill takes, said before anything starts.
    service.apply_schedule(
        app, {"name": "hourly", "cron": "0 * * * *", "steps": [{"name": "s", "task": "chordbeat.examples.sleep"}]}
    )
    huge = urlencode({"name": "hourly", "from": "2024-01-01T00:00Z", "to": "2026-01-01T00:00Z"})
    r = admin.get(web.url + f"/act/backfill?{huge}", timeout=10)
    assert r.status_code == 400 and "end: the range holds more than 10000 slots" in r.text, text_of(r.text)

    # The confirmation: a POST with the xsrf token, by an admin.
    form = {**request, "max_concurrent": "1", "reason": "outage"}
    assert admin.post(web.url + "/act/backfill", data=form, timeout=10).status_code == 403
    assert viewer.post(web.url + "/act/backfill", data={**form, "_xsrf": xsrf(viewer)}, timeout=10).status_code == 403
    r = admin.post(web.url + "/act/backfill", data={**form, "_xsrf": xsrf(admin)}, allow_redirects=False, timeout=10)
    assert r.status_code == 302 and r.headers["Location"] == "/schedule?name=nightly", r.text
    (backfill,) = backfill_service.list_backfills(app, "nightly")
    assert (backfill["actor"], backfill["reason"], backfill["total"]) == ("ops", "outage", 25)
    trail = service.list_audit(app, schedule="nightly")
    assert any(e["source"] == "web" and e["actor"] == "ops" and e["action"] == "trigger" for e in trail), trail
    wait_for(
        lambda: backfill_service.get_backfill(app, backfill["id"])["status"] == "completed",
        60,
        what="the backfill to complete",
    )
    page = text_of(admin.get(web.url + "/schedule/fragment?name=nightly", timeout=10).text)
    assert re.search(rf"#{backfill['id']} completed .*25/25 started, 25 completed", page), page
    assert "Cancel…" not in page

    # A backfill run's page says which slot it is for.
    first = service.list_executions(app, schedule="nightly", limit=500)[-1]
    html = admin.get(web.url + f"/execution/{first['id']}", timeout=10).text
    assert f'href="/schedule?name=nightly#backfill-{backfill["id"]}" id="run-backfill"' in html  # to its progress
    run = text_of(html)
    assert re.search(
        r"trigger backfill \( ?backfill #\d+ ?\) · for slot \d{4}-\d\d-\d\d 02:00:00 \+0[01]:00 (GMT|BST)", run
    ), run


def test_cancel_asks_first_and_catch_ups_show_too(app: ChordbeatCelery, web: WebServer, worker: Any) -> None:
    _nightly(app, "slow", seconds=30)
    admin = web.session(ADMIN)
    now = utcnow()
    start = (now - timedelta(days=6)).isoformat()
    backfill_id = backfill_service.backfill_schedule(app, "slow", start, now.isoformat())["backfill_id"]
    page = text_of(admin.get(web.url + "/schedule?name=slow", timeout=10).text)
    assert re.search(rf"#{backfill_id} running .*1/6 started, 1 running", page), page
    assert "Cancel…" in page
    asked = text_of(admin.get(web.url + f"/act/cancel-backfill/{backfill_id}", timeout=10).text)
    assert f"This will cancel backfill #{backfill_id} of slow (1/6 started, 1 running)." in asked, asked
    assert "Its 5 slots not started never start" in asked
    form = {"_xsrf": xsrf(admin), "next": "/schedule?name=slow"}
    r = admin.post(web.url + f"/act/cancel-backfill/{backfill_id}", data=form, timeout=10)
    assert r.status_code == 400 and "a reason is required to cancel" in r.text
    assert backfill_service.get_backfill(app, backfill_id)["status"] == "running"
    r = admin.post(web.url + f"/act/cancel-backfill/{backfill_id}", data={**form, "reason": "enough"}, timeout=10)
    assert r.status_code == 200 and r.url.endswith("/schedule?name=slow")
    assert f"backfill #{backfill_id} cancelled (1/6 started, 1 running)" in text_of(r.text)
    assert backfill_service.get_backfill(app, backfill_id)["status"] == "cancelled"
    # A catch-up (what a late fire of a catchup: all schedule makes) shows beside the backfills.
    with transaction(app.settings.database_url) as session:
        schedule = session.query(Schedule).filter_by(name="slow").one()
        slot = datetime.fromisoformat(start) + timedelta(days=1)
        made = create_backfill(session, schedule, [slot], origin=BackfillOrigin.CATCHUP, max_concurrent=1, now=utcnow())
    page = text_of(admin.get(web.url + "/schedule/fragment?name=slow", timeout=10).text)
    assert re.search(rf"#{made.backfill_id} catch-up running", page) and "catch-up (beat&#x27;s fire)" in page, page
    backfill_service.cancel_backfill(app, made.backfill_id)  # it would start when the run in progress ends
    # A paused schedule's backfill would wait for its resume: the dry run says so.
    service.pause_schedule(app, "slow")
    earlier = urlencode({"name": "slow", "from": _london_midnight(12), "to": _london_midnight(9)})
    assert (
        "slow is paused: the runs start when it is resumed."
        in admin.get(web.url + f"/act/backfill?{earlier}", timeout=10).text
    )
    for execution in service.list_executions(app, schedule="slow", status="in_progress"):
        service.cancel_execution(app, execution["id"])  # the 30 s steps need not be waited out


def test_a_time_at_the_start_of_year_one_is_refused_not_a_server_error(app: ChordbeatCelery, web: WebServer) -> None:
    # London wall time of 0001-01-01 00:00 is before UTC's year 1 by its LMT offset; one east of
    # UTC is too: the range walk stepped into year 0 and the page answered 500.
    _nightly(app, "nightly")
    _nightly(app, "delhi", timezone="Asia/Kolkata")
    admin = web.session(ADMIN)
    for name in ("nightly", "delhi"):
        request = {"name": name, "from": "0001-01-01T00:00", "to": "0001-01-03T00:00", "mode": "all"}
        r = admin.get(web.url + "/act/backfill?" + urlencode(request), timeout=10)
        assert r.status_code == 400 and "start: is out of range" in r.text, (name, r.status_code)
        form = {**request, "max_concurrent": "1", "_xsrf": xsrf(admin)}
        r = admin.post(web.url + "/act/backfill", data=form, timeout=10)
        assert r.status_code == 400 and "start: is out of range" in r.text, (name, r.status_code)
        assert backfill_service.list_backfills(app, name) == []


def test_a_backfill_past_the_schedules_bound_is_refused_on_the_form(app: ChordbeatCelery, web: WebServer) -> None:
    """The form goes through the service's path: its bound on pending slots refuses it, naming `end`."""
    _nightly(app, "nightly")
    previous = app.settings
    app.apply_settings(dataclasses.replace(previous, backfill_max_pending_per_schedule=3))
    try:
        admin = web.session(ADMIN)
        request = {"name": "nightly", "from": _london_midnight(6), "to": _london_midnight(1), "mode": "all"}
        r = admin.get(web.url + "/act/backfill?" + urlencode(request), timeout=10)
        assert r.status_code == 400 and "CHORDBEAT_BACKFILL_MAX_PENDING_PER_SCHEDULE" in r.text, r.status_code
        form = {**request, "max_concurrent": "1", "_xsrf": xsrf(admin)}
        r = admin.post(web.url + "/act/backfill", data=form, timeout=10)
        assert r.status_code == 400 and "end: 5 slots would leave 5 not started" in r.text, r.status_code
        assert backfill_service.list_backfills(app, "nightly") == []
    finally:
        app.apply_settings(previous)


def test_the_form_asks_24_hour_text_in_the_schedules_zone_and_says_why_nothing(
    app: ChordbeatCelery, web: WebServer
) -> None:
    """Not a ``datetime-local`` field (the browser showed it in its 12-hour locale, in no stated
    zone): text in a stated format and zone, read as the CLI reads --from/--to."""
    _nightly(app, "nightly")
    service.apply_schedule(
        app, {"name": "hourly", "every": 3600, "steps": [{"name": "s", "task": "chordbeat.examples.sleep"}]}
    )
    admin = web.session(ADMIN)
    page = admin.get(web.url + "/schedule?name=nightly", timeout=10).text
    fields = re.findall(r'<input type="(\w+)" name="(from|to)"', page)
    assert fields == [("text", "from"), ("text", "to")], fields
    assert "datetime-local" not in page
    note = text_of(re.search(r'<p class="muted" id="backfill-times">.*?</p>', page, re.S)[0])  # type: ignore[index]
    assert "YYYY-MM-DD HH:MM, 24-hour, in Europe/London time" in note and "--from/--to" in note, note
    day = (datetime.now(LONDON) - timedelta(days=5)).date()
    request = {"name": "nightly", "from": f"{day} 03:00", "to": f"{day + timedelta(days=1)} 03:00"}
    shown = text_of(admin.get(web.url + "/act/backfill?" + urlencode(request), timeout=10).text)
    assert "This will start 1 run of nightly" in shown, shown
    assert f"{day + timedelta(days=1)} 02:00:00" in shown, shown  # London's 02:00 of the next day
    request = {"name": "hourly", "from": f"{day}", "to": f"{day + timedelta(days=1)}"}
    shown = text_of(admin.get(web.url + "/act/backfill?" + urlencode(request), timeout=10).text)
    assert "nothing to start" in shown and "Why: no slot from " in shown, shown
    assert "an interval schedule&#x27;s slots begin when its definition was last applied" in shown, shown
    # A slot of 5 days ago, backfilled: its record says it came before the schedule existed.
    start = datetime.combine(day, datetime.min.time(), LONDON)
    backfill_service.backfill_schedule(app, "nightly", start.isoformat(), (start + timedelta(days=1)).isoformat())
    page = text_of(admin.get(web.url + "/schedule?name=nightly", timeout=10).text)
    assert "before the schedule existed: created " in page, page
