"""The dashboard over HTTP: login, roles, CSRF, escaping, and the pages' content with real runs."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
import requests
from sqlalchemy import update

from celeryapp.application import ChordbeatCelery
from celeryapp.domain.names import PREFIX
from celeryapp.interfaces import service
from celeryapp.recovery.paused_slots import record_all_paused
from celeryapp.states import AuditAction, AuditSource
from models import Activity, Schedule, transaction, utcnow
from models.audit import BEAT
from tests.support.servers import wait_for
from tests.support.web_server import ADMIN, VIEWER, WebServer, text_of, xsrf

pytestmark = pytest.mark.both_databases
HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'


@pytest.fixture
def web(app: ChordbeatCelery) -> Iterator[WebServer]:
    with WebServer(app) as server:
        yield server


def _define(app: ChordbeatCelery, name: str, steps: list[Any]) -> None:
    service.apply_schedule(app, {"name": name, "cron": "0 2 * * *", "timezone": "Europe/London", "steps": steps})


def _status(app: ChordbeatCelery, name: str) -> str:
    return str(service.get_schedule(app, name)["status"])


def test_pages_need_a_login(app: ChordbeatCelery, web: WebServer) -> None:
    _define(app, "nightly", [{"name": "a", "task": "chordbeat.examples.sleep"}])
    anonymous = web.session()
    for path in ("/", "/schedule?name=nightly", "/execution/1", "/health", "/schedules/fragment"):
        r = anonymous.get(web.url + path, allow_redirects=False, timeout=10)
        assert r.status_code == 302, path
        assert r.headers["Location"].startswith("/login?next="), path
    # An action without a session is refused even with a valid CSRF token.
    r = anonymous.post(web.url + "/act/pause", data={"name": "nightly", "_xsrf": xsrf(anonymous)}, timeout=10)
    assert r.status_code == 403
    assert _status(app, "nightly") == "active"


def test_wrong_password_and_foreign_next_are_refused(web: WebServer) -> None:
    session = web.session()
    r = session.post(
        web.url + "/login", data={"username": ADMIN[0], "password": "nope", "_xsrf": xsrf(session)}, timeout=10
    )
    assert r.status_code == 401
    assert "Wrong user name or password" in r.text
    r = session.post(
        web.url + "/login?next=//evil.example/",
        data={"username": VIEWER[0], "password": VIEWER[1], "_xsrf": xsrf(session)},
        allow_redirects=False,
        timeout=10,
    )
    assert r.status_code == 302
    assert r.headers["Location"] == "/"


#: ``next`` values a browser reads as //evil.example (tab and newlines dropped, backslash a slash).
ANOTHER_SITE = ("/\t/evil.example", "/\n/evil.example", "/\r/evil.example", "/\\evil.example", "\\/evil.example")


def test_a_next_a_browser_reads_as_another_site_never_leaves_the_dashboard(
    app: ChordbeatCelery, web: WebServer
) -> None:
    _define(app, "nightly", [{"name": "a", "task": "chordbeat.examples.sleep"}])
    admin = web.session(ADMIN)
    for target in ANOTHER_SITE:
        # The login: where it sends the browser once logged in.
        login = web.session()
        r = login.post(
            web.url + "/login",
            params={"next": target},
            data={"username": VIEWER[0], "password": VIEWER[1], "_xsrf": xsrf(login)},
            allow_redirects=False,
            timeout=10,
        )
        assert (r.status_code, r.headers["Location"]) == (302, "/"), repr(target)
        # The confirmation page: its Back link and the form's next are the dashboard's.
        page = admin.get(web.url + "/act/run", params={"name": "nightly", "next": target}, timeout=10)
        assert page.status_code == 200
        back = re.search(r'<a href="([^"]*)" id="confirm-back"', page.text)
        assert back is not None and html.unescape(back.group(1)) == "/", repr(target)
        assert "evil.example" not in page.text, repr(target)
        # The action: where it sends the browser once done.
        form = {"name": "nightly", "next": target, "_xsrf": xsrf(admin)}
        r = admin.post(web.url + "/act/resume", data=form, allow_redirects=False, timeout=10)
        assert (r.status_code, r.headers["Location"]) == (302, "/"), repr(target)


def test_a_changed_password_or_removed_user_ends_the_session(app: ChordbeatCelery) -> None:
    with WebServer(app) as before:
        admin, viewer = before.session(ADMIN), before.session(VIEWER)
        assert admin.get(before.url + "/", allow_redirects=False, timeout=10).status_code == 200
    with WebServer(app, users=f"{ADMIN[0]}:admin:new-password,{VIEWER[0]}:viewer:{VIEWER[1]}") as after:
        assert admin.get(after.url + "/", allow_redirects=False, timeout=10).status_code == 302
        assert viewer.get(after.url + "/", allow_redirects=False, timeout=10).status_code == 200
    with WebServer(app, users=f"{ADMIN[0]}:admin:new-password") as after:
        assert viewer.get(after.url + "/", allow_redirects=False, timeout=10).status_code == 302


def test_an_action_without_csrf_token_is_refused(app: ChordbeatCelery, web: WebServer) -> None:
    _define(app, "nightly", [{"name": "a", "task": "chordbeat.examples.sleep"}])
    admin = web.session(ADMIN)
    r = admin.post(web.url + "/act/pause", data={"name": "nightly"}, timeout=10)
    assert r.status_code == 403
    r = admin.post(web.url + "/act/pause", data={"name": "nightly", "_xsrf": "forged"}, timeout=10)
    assert r.status_code == 403
    assert _status(app, "nightly") == "active"
    r = admin.post(
        web.url + "/act/pause", data={"name": "nightly", "reason": "maintenance", "_xsrf": xsrf(admin)}, timeout=10
    )
    assert r.status_code == 200
    assert _status(app, "nightly") == "paused"
    assert "nightly: paused" in r.text


def test_a_viewer_can_look_but_not_act(app: ChordbeatCelery, web: WebServer) -> None:
    _define(app, "nightly", [{"name": "a", "task": "chordbeat.examples.sleep"}])
    viewer = web.session(VIEWER)
    page = viewer.get(web.url + "/", timeout=10)
    assert page.status_code == 200
    assert "nightly" in page.text
    assert "Pause" not in page.text and "Run now" not in page.text
    for action in ("pause", "run"):
        r = viewer.post(web.url + f"/act/{action}", data={"name": "nightly", "_xsrf": xsrf(viewer)}, timeout=10)
        assert r.status_code == 403, action
    assert _status(app, "nightly") == "active"
    assert service.list_executions(app, schedule="nightly") == []
    admin = web.session(ADMIN)
    assert "Pause" in admin.get(web.url + "/", timeout=10).text


def test_a_viewers_session_record_made_an_admins_in_redis_is_refused_and_ends(
    app: ChordbeatCelery, web: WebServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Sessions live in Redis. Anyone who could write there used to make a viewer an admin by
    copying an admin's record over the viewer's (the record named its user and a stamp of the
    entry, nothing tied it to its key). Records are signed now: an edited or moved one is refused,
    logged, and the session ends."""
    _define(app, "nightly", [{"name": "a", "task": "chordbeat.examples.sleep"}])
    client = redis.Redis.from_url(app.settings.broker_url)

    def new_record(user: tuple[str, str]) -> tuple[Any, str]:
        before = set(client.keys(f"{PREFIX}:web:session:*"))
        session = web.session(user)
        (key,) = set(client.keys(f"{PREFIX}:web:session:*")) - before
        return session, key

    _, admin_key = new_record(ADMIN)
    admins = json.loads(client.get(admin_key) or b"{}")
    forgeries = {
        "admin's record copied": lambda viewers: admins,
        "user and role rewritten": lambda viewers: {
            **viewers,
            "user": ADMIN[0],
            "role": "admin",
            "stamp": admins["stamp"],
        },
        "role rewritten": lambda viewers: {**viewers, "role": "admin"},
    }
    for forgery, forge in forgeries.items():
        viewer, viewer_key = new_record(VIEWER)
        client.set(viewer_key, json.dumps(forge(json.loads(client.get(viewer_key) or b"{}"))), keepttl=True)
        caplog.clear()
        r = viewer.post(web.url + "/act/pause", data={"name": "nightly", "_xsrf": xsrf(viewer)}, timeout=10)
        assert r.status_code == 403, forgery
        assert _status(app, "nightly") == "active", forgery
        assert client.exists(viewer_key) == 0, forgery
        assert "fails its signature" in caplog.text, forgery
        r = viewer.get(web.url + "/", allow_redirects=False, timeout=10)
        assert r.status_code == 302 and r.headers["Location"].startswith("/login"), forgery
    assert client.exists(admin_key) == 1  # the admin's own session holds


def test_hostile_names_and_errors_render_as_text(app: ChordbeatCelery, web: WebServer, worker: Any) -> None:
    _define(app, "hostile", [{"name": HOSTILE, "task": "chordbeat.examples.fail", "kwargs": {"message": HOSTILE}}])
    # A name stored before today's naming rule, as an old database may hold.
    with transaction(app.settings.database_url) as session:
        session.execute(update(Schedule).where(Schedule.name == "hostile").values(name=HOSTILE))
    started = service.trigger_schedule(app, HOSTILE)
    run = started["execution_id"]
    wait_for(lambda: service.get_execution(app, run)["status"] == "failed", 30, what="the run to fail")
    admin = web.session(ADMIN)
    pages = [
        "/",
        "/schedules/fragment",
        f"/schedule?name={HOSTILE}",
        f"/execution/{run}",
        f"/execution/{run}/fragment",
        f"/execution/{run}/step?step={HOSTILE}",
    ]
    for path in pages:
        r = admin.get(web.url + path, params=None, timeout=10)
        assert r.status_code == 200, path
        assert "<script>alert" not in r.text and "<img src=x" not in r.text, path
        assert html.escape(HOSTILE, quote=False)[:20] in r.text, path
    assert r.headers["Content-Security-Policy"].startswith("default-src 'self'")


def test_pages_show_runs_steps_and_health(app: ChordbeatCelery, web: WebServer, worker: Any) -> None:
    _define(
        app,
        "nightly",
        [
            {"name": "import", "task": "chordbeat.examples.sleep", "kwargs": {"seconds": 0.1}},
            [
                {"name": "export", "task": "chordbeat.examples.warn", "kwargs": {"message": "3 rows skipped"}},
                {"name": "notify", "task": "chordbeat.examples.fail", "kwargs": {"message": "mail server down"}},
            ],
        ],
    )
    run = service.trigger_schedule(app, "nightly")["execution_id"]
    wait_for(lambda: service.get_execution(app, run)["status"] == "failed", 30, what="the run to fail")
    admin = web.session(ADMIN)
    listing = text_of(admin.get(web.url + "/?q=NIGH", timeout=10).text)
    assert "02:00 every day, Europe/London" in listing
    assert "1 schedule " in listing and "failed" in listing
    assert "0 schedules" in text_of(admin.get(web.url + "/?q=nothing-like-it", timeout=10).text)
    schedule = admin.get(web.url + "/schedule?name=nightly", timeout=10).text
    assert "cell s-failed_with_error" in schedule and "cell s-complete_with_warning" in schedule
    # No alerts in its definition: nothing to silence, and the page says why there is no button.
    assert "act-silence" not in schedule and 'id="no-alerts"' in schedule
    # Next ten fire times across the end of British Summer Time would show both offsets; here
    # (November) they are all GMT.
    assert text_of(schedule).count("02:00:00 +00:00 GMT") == 10
    # The traceback and last log lines as the worker keeps them (bounded, redacted), folded.
    with transaction(app.settings.database_url) as session:
        session.execute(
            update(Activity)
            .where(Activity.execution_id == run, Activity.step_name == "notify")
            .values(traceback="Traceback (most recent call last):\nStepFailed: disk", log_tail="sent 3\nretry")
        )
    raw = admin.get(web.url + f"/execution/{run}/step?step=notify", timeout=10).text
    step = text_of(raw)
    # People's words, not the stored name.
    assert "mail server down" in step and " failed " in step and "_with_" not in step
    assert '<details class="evidence"><summary>Traceback</summary><pre class="error traceback">Traceback (most' in raw
    assert '<details class="evidence"><summary>Last log lines</summary><pre class="log">sent 3\nretry' in raw
    execution = text_of(admin.get(web.url + f"/execution/{run}", timeout=10).text)
    assert "3 rows skipped" in execution and "mail server down" in execution
    assert "Cancel this run" not in execution
    # A step's output as JSON, as the payload is shown (issue 38: it was Python's {'slept': 0.1}).
    imported = html.unescape(text_of(admin.get(web.url + f"/execution/{run}/step?step=import", timeout=10).text))
    assert '{"slept": 0.1}' in imported, imported
    health = text_of(admin.get(web.url + "/health", timeout=10).text)
    assert "alive" in health and "chordbeat.control" in health


def test_missing_pages_are_404(web: WebServer) -> None:
    admin = web.session(ADMIN)
    assert admin.get(web.url + "/schedule?name=nope", timeout=10).status_code == 404
    assert admin.get(web.url + "/execution/999", timeout=10).status_code == 404
    # Beyond what the id column holds, and longer than any name: not found, not a database error.
    assert admin.get(web.url + "/execution/999999999999", timeout=10).status_code == 404
    assert admin.get(web.url + "/execution/999999999999/fragment", timeout=10).status_code == 404
    assert admin.get(web.url + "/schedule", params={"name": "n" * 5000}, timeout=10).status_code == 404
    assert admin.get(web.url + "/schedule", params={"name": "a\x00b"}, timeout=10).status_code == 404


def test_the_favicon_is_served_without_a_login(web: WebServer) -> None:
    """Browsers ask /favicon.ico whatever the page says: a 404 line in the log each time, before."""
    r = requests.get(web.url + "/favicon.ico", timeout=10)
    assert r.status_code == 200 and r.content.startswith(b"\x00\x00\x01\x00"), (r.status_code, r.headers)
    page = requests.get(web.url + "/login", timeout=10).text
    assert re.search(r'<link rel="icon" href="/static/favicon\.svg\?v=\w+" type="image/svg\+xml">', page), page


def test_the_health_page_survives_redis_closing_its_connections(app: ChordbeatCelery, web: WebServer) -> None:
    """Redis restarted or timed out idle clients: the pooled connections the page's worker ping
    would use are closed. The page still answers (CI once saw a 500 here)."""
    admin = web.session(ADMIN)
    assert admin.get(web.url + "/health", timeout=10).status_code == 200
    killer = redis.Redis.from_url(app.settings.broker_url)
    try:
        for kind in ("normal", "pubsub"):
            killer.client_kill_filter(_type=kind, skipme=True)
    finally:
        killer.close()
    page = admin.get(web.url + "/health", timeout=10)
    assert page.status_code == 200, page.text


def test_actions_ask_first_need_a_reason_and_leave_a_trail(app: ChordbeatCelery, web: WebServer) -> None:
    service.apply_schedule(
        app,
        {
            "name": "nightly",
            "cron": "0 2 * * *",
            "timezone": "Europe/London",
            "payload": {"region": "eu"},
            "steps": [{"name": "a", "task": "chordbeat.examples.sleep"}],
        },
    )
    viewer, admin = web.session(VIEWER), web.session(ADMIN)
    for path in ("/act/pause?name=nightly", "/act/run?name=nightly"):
        assert viewer.get(web.url + path, timeout=10).status_code == 403, path

    # Pause: the page says what will happen and changes nothing; without a reason, nothing either.
    page = admin.get(web.url + "/act/pause?name=nightly&next=/", timeout=10)
    assert page.status_code == 200
    assert "This will pause nightly." in text_of(page.text)
    assert re.search(r'<input id="reason" name="reason"[^>]* required', page.text)
    form = {"name": "nightly", "next": "/", "_xsrf": xsrf(admin)}
    r = admin.post(web.url + "/act/pause", data=form, timeout=10)
    assert r.status_code == 400 and "a reason is required to pause" in r.text
    assert _status(app, "nightly") == "active"
    r = admin.post(web.url + "/act/pause", data={**form, "reason": "disk <b>full</b>"}, timeout=10)
    assert r.status_code == 200 and _status(app, "nightly") == "paused"
    shown = "paused by ops since "
    listing = text_of(admin.get(web.url + "/", timeout=10).text)
    assert shown in listing and " · reason: disk &lt;b&gt;full&lt;/b&gt;" in listing
    schedule = text_of(admin.get(web.url + "/schedule?name=nightly", timeout=10).text)
    assert shown in schedule
    assert re.search(r"Activity .*ops \(web\) pause disk &lt;b&gt;full", schedule)

    # Run now: the schedule's payload to edit; a JSON mistake is shown where it is, nothing starts.
    page = admin.get(web.url + "/act/run?name=nightly", timeout=10)
    assert "&quot;region&quot;: &quot;eu&quot;" in page.text
    form = {"name": "nightly", "_xsrf": xsrf(admin)}
    for typed, error in (('{"region": "us",\n  "rows": }', "line 2, column 11"), ("[1]", "must be a JSON object")):
        r = admin.post(web.url + "/act/run", data={**form, "payload": typed}, timeout=10)
        assert r.status_code == 400 and error in r.text, r.text
        assert html.escape(typed) in r.text  # what was typed is kept
    assert service.list_executions(app, schedule="nightly") == []
    r = admin.post(
        web.url + "/act/run", data={**form, "payload": '{"region": "us"}'}, allow_redirects=False, timeout=10
    )
    run = service.list_executions(app, schedule="nightly")[0]["id"]
    assert r.status_code == 302 and r.headers["Location"] == f"/execution/{run}"
    assert service.get_execution(app, run)["payload"] == {"region": "us"}
    execution = text_of(admin.get(web.url + f"/execution/{run}", timeout=10).text)
    assert "&quot;region&quot;: &quot;us&quot;" in execution
    assert re.search(r"Activity .*ops \(web\) trigger", execution)

    # Cancel: what and for how long it ran, a reason required, then who did it on the run.
    page = text_of(admin.get(web.url + f"/act/cancel/{run}", timeout=10).text)
    assert re.search(rf"This will cancel execution {run} of nightly, running \d+(\.\d)? s\.", page), page
    form = {"_xsrf": xsrf(admin)}
    assert admin.post(web.url + f"/act/cancel/{run}", data=form, timeout=10).status_code == 400
    assert service.get_execution(app, run)["status"] == "in_progress"
    r = admin.post(web.url + f"/act/cancel/{run}", data={**form, "reason": "wrong region"}, timeout=10)
    assert r.status_code == 200 and r.url.endswith(f"/execution/{run}")
    assert re.search(r"cancelled by ops \(web\) (now|\d+ s ago): wrong region", text_of(r.text))
    assert service.get_execution(app, run)["status"] == "cancelled"


def test_a_paused_schedules_due_times_show_in_its_slot_record(app: ChordbeatCelery, web: WebServer) -> None:
    service.apply_schedule(
        app, {"name": "often", "every": 2, "steps": [{"name": "a", "task": "chordbeat.examples.sleep"}]}
    )
    service.pause_schedule(app, "often", actor="ops", reason="maintenance", source=AuditSource.WEB)
    record_all_paused(app.settings.database_url, now=utcnow() + timedelta(seconds=7))
    page = text_of(web.session(ADMIN).get(web.url + "/schedule?name=often", timeout=10).text)
    assert page.count("skipped: paused") >= 3
    assert "paused by ops: maintenance" in page
    # Texts beat writes with instants in them (a long pause's summary row, a retry's reason) show
    # them as people's times, like every other time on the page.
    record_all_paused(app.settings.database_url, now=utcnow() + timedelta(seconds=200))
    with transaction(app.settings.database_url) as session:
        BEAT.record(session, AuditAction.RETRY_SCHEDULED, "often", reason="retry 1 at 2026-11-24T14:33:00.000Z")
    page = text_of(web.session(ADMIN).get(web.url + "/schedule?name=often", timeout=10).text)
    assert "so were the later slots until 20" in page and "retry 1 at 2026-11-24 14:33:00 +00:00" in page
    assert not re.search(r"\d\dT\d\d:\d\d", page), page
