"""The dashboard's login holds, against a real ``chordbeat web`` (real Redis, real database) over
HTTP: throttling with lockout (429 and Retry-After) per user and per address, audited; hashing in
a bounded pool of its own while pages keep being served; Secure ``__Host-`` cookies behind the
trusted TLS proxy only; sessions kept server-side, so a logged-out cookie replayed is refused."""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any

import pytest
import requests
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from sqlalchemy import select

from celeryapp.application import ChordbeatCelery
from celeryapp.interfaces.web.auth import hash_password
from celeryapp.interfaces.web.throttle import ADDRESS_ATTEMPTS, ADDRESS_WINDOW_S, USER_ATTEMPTS, USER_LOCKOUT_S
from models import transaction
from models.tables import AUDIT_EVENTS
from tests.support.chromium import chromium
from tests.support.login_server import LoginServer, chordbeat_web
from tests.support.servers import RedisServer, free_port, wait_for

ADMIN = ("ops", "ops-password")
VIEWER = ("watcher", "watcher-password")


def _users(iterations: int = 1000) -> str:
    return f"{ADMIN[0]}:admin:{hash_password(ADMIN[1], iterations=iterations)},{VIEWER[0]}:viewer:{VIEWER[1]}"


@pytest.fixture
def web(app: ChordbeatCelery, tmp_path: Path) -> Iterator[LoginServer]:
    with chordbeat_web(app.settings, tmp_path, _users()) as server:
        yield server


def _audit(app: ChordbeatCelery) -> list[dict[str, Any]]:
    with transaction(app.settings.database_url, read_only=True) as session:
        rows = session.execute(select(AUDIT_EVENTS).order_by(AUDIT_EVENTS.c.id)).mappings().all()
        return [dict(row) for row in rows]


def _set_cookies(response: requests.Response) -> dict[str, str]:
    """Each cookie the response sets, by name: its whole ``Set-Cookie`` line."""
    lines = response.raw.headers.getlist("Set-Cookie")
    return {next(iter(SimpleCookie(line))): line for line in lines}


def test_the_sixth_wrong_password_is_refused_with_retry_after_and_audited(
    app: ChordbeatCelery, web: LoginServer
) -> None:
    guesser = web.client("127.0.0.1")
    for _ in range(USER_ATTEMPTS):
        assert web.log_in(guesser, ADMIN[0], "guess").status_code == 401
    refused = web.log_in(guesser, ADMIN[0], "guess")
    assert refused.status_code == 429
    assert 0 < int(refused.headers["Retry-After"]) <= USER_LOCKOUT_S
    assert "Too many login attempts" in refused.text
    # Locked out from everywhere, even with the right password.
    assert web.log_in(web.client("127.0.0.2"), *ADMIN).status_code == 429
    # Another user is still served, from the same address as the guesses.
    assert web.log_in(guesser, *VIEWER).status_code == 302

    rows = _audit(app)
    failed = [r for r in rows if r["action"] == "login_failed"]
    locked = [r for r in rows if r["action"] == "locked_out"]
    assert len(failed) == USER_ATTEMPTS
    assert {(r["actor"], r["source"], r["schedule_name"]) for r in failed} == {(ADMIN[0], "web", None)}
    assert failed[0]["detail"]["address"] == "127.0.0.1"
    assert len(locked) == 1 and locked[0]["actor"] == ADMIN[0] and locked[0]["source"] == "web"
    assert locked[0]["detail"]["scope"] == "user"


def test_an_address_over_its_limit_waits_while_another_address_is_served(
    app: ChordbeatCelery, web: LoginServer
) -> None:
    guesser = web.client("127.0.0.3")
    # Unknown names, a few at a time (fewer than the hashing pool holds): the address's limit,
    # not any user's, is what stops them.
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda n: web.log_in(guesser, f"nobody-{n}", "x").status_code, range(ADDRESS_ATTEMPTS)))
    assert answers == [401] * ADDRESS_ATTEMPTS
    refused = web.log_in(guesser, *VIEWER)
    assert refused.status_code == 429
    assert 0 < int(refused.headers["Retry-After"]) <= ADDRESS_WINDOW_S
    assert web.log_in(web.client("127.0.0.4"), *VIEWER).status_code == 302
    locked = [r for r in _audit(app) if r["action"] == "locked_out"]
    assert [(r["detail"]["scope"], r["detail"]["address"]) for r in locked] == [("address", "127.0.0.3")]


# Twenty refused logins, each padded to the 1 s floor: over the default 30 s on a loaded machine.
@pytest.mark.timeout(120)
def test_ipv6_clients_behind_the_proxy_are_counted_by_their_64(app: ChordbeatCelery, tmp_path: Path) -> None:
    """Every address of a /64 is one holder's: counted apart, it had 2**64 fresh counts. Through
    the trusted proxy's ``X-Forwarded-For``, as this machine's one IPv6 loopback address (``::1``)
    cannot be the peer of many addresses of one /64."""
    with chordbeat_web(app.settings, tmp_path, _users(), CHORDBEAT_WEB_TRUSTED_PROXY="127.0.0.2") as web:
        proxy = web.client("127.0.0.2")

        def log_in(address: str, name: str, password: str) -> int:
            return web.log_in(proxy, name, password, **{"X-Forwarded-For": address}).status_code

        answers = [log_in(f"2001:db8:5:6::{n + 1:x}", f"nobody-{n}", "x") for n in range(ADDRESS_ATTEMPTS)]
        assert answers == [401] * ADDRESS_ATTEMPTS
        assert log_in("2001:db8:5:6:ffff:ffff:ffff:ffff", *VIEWER) == 429
        assert log_in("2001:db8:5:7::1", *VIEWER) == 302  # the next /64 is someone else
    locked = [r for r in _audit(app) if r["action"] == "locked_out"]
    assert [(r["detail"]["scope"], r["detail"]["address"]) for r in locked] == [
        ("address", "2001:db8:5:6:ffff:ffff:ffff:ffff")
    ]


def test_forty_parallel_guesses_are_bounded_while_pages_are_still_served(app: ChordbeatCelery, tmp_path: Path) -> None:
    """Hashing has a bounded pool of its own: past it, guesses are refused at once (429), and page
    reads, which use the default pool, keep being answered. (Timings: docs/security.md.)"""
    with chordbeat_web(app.settings, tmp_path, _users(iterations=600_000)) as web:
        reader = web.client("127.0.0.9")
        assert web.log_in(reader, *VIEWER).status_code == 302
        guessers = [web.client(f"127.0.1.{n}") for n in range(40)]
        start = threading.Barrier(len(guessers) + 1)
        reads: list[tuple[float, int]] = []
        stop = threading.Event()

        def read() -> None:
            while not stop.is_set():
                reads.append(
                    (time.monotonic(), reader.get(web.url + "/", allow_redirects=False, timeout=30).status_code)
                )

        def guess(n: int) -> tuple[int, str | None]:
            start.wait()
            r = web.log_in(guessers[n], f"guess-{n}", "wrong")
            return r.status_code, r.headers.get("Retry-After")

        with ThreadPoolExecutor(len(guessers) + 1) as pool:
            reading = pool.submit(read)
            answers = pool.map(guess, range(len(guessers)))
            start.wait()
            began = time.monotonic()
            answered = list(answers)
            ended = time.monotonic()
            stop.set()
            reading.result()
    assert {code for code, _ in answered} <= {401, 429}
    assert ("429", "1") in {(str(code), after) for code, after in answered}, answered
    during = [code for at, code in reads if began <= at <= ended]
    assert during and set(during) == {200}, reads


def test_behind_the_trusted_proxy_cookies_are_secure_host_cookies(app: ChordbeatCelery, tmp_path: Path) -> None:
    with chordbeat_web(app.settings, tmp_path, _users(), CHORDBEAT_WEB_TRUSTED_PROXY="127.0.0.2") as web:
        https = {"X-Forwarded-Proto": "https"}
        proxy = requests.Session()
        proxy.mount("http://", web.client("127.0.0.2").get_adapter("http://"))
        page = proxy.get(web.url + "/login", headers=https, timeout=10)
        xsrf = _set_cookies(page)["__Host-chordbeat_xsrf"]
        assert "Secure" in xsrf and "Path=/" in xsrf and "Domain" not in xsrf
        token = SimpleCookie(xsrf)["__Host-chordbeat_xsrf"].value
        login = proxy.post(
            web.url + "/login",
            data={"username": ADMIN[0], "password": ADMIN[1], "_xsrf": token},
            headers={**https, "Cookie": f"__Host-chordbeat_xsrf={token}"},
            allow_redirects=False,
            timeout=10,
        )
        assert login.status_code == 302, login.text
        session = _set_cookies(login)["__Host-chordbeat_session"]
        assert "Secure" in session and "HttpOnly" in session and "Path=/" in session and "Domain" not in session
        value = SimpleCookie(session)["__Host-chordbeat_session"].value
        cookie = {"Cookie": f"__Host-chordbeat_session={value}"}
        assert (
            proxy.get(web.url + "/", headers={**https, **cookie}, allow_redirects=False, timeout=10).status_code == 200
        )

        # Anyone else's X-Forwarded-Proto is not believed: plain names, not Secure.
        direct = requests.get(web.url + "/login", headers=https, timeout=10)
        cookies = _set_cookies(direct)
        assert "_xsrf" in cookies and "Secure" not in cookies["_xsrf"]


def test_a_logged_out_session_cookie_replayed_is_refused(web: LoginServer) -> None:
    browser = web.client()
    assert web.log_in(browser, *ADMIN).status_code == 302
    stolen = browser.cookies["chordbeat_session"]
    assert browser.get(web.url + "/", allow_redirects=False, timeout=10).status_code == 200
    out = browser.post(web.url + "/logout", data={"_xsrf": browser.cookies["_xsrf"]}, allow_redirects=False, timeout=10)
    assert out.status_code == 302
    replay = requests.Session()
    replay.cookies.set("chordbeat_session", stolen)
    r = replay.get(web.url + "/", allow_redirects=False, timeout=10)
    assert r.status_code == 302 and r.headers["Location"].startswith("/login")


def test_without_redis_nobody_logs_in_and_the_login_page_says_why(app: ChordbeatCelery, tmp_path: Path) -> None:
    nowhere = dataclasses.replace(app.settings, broker_url=f"redis://127.0.0.1:{free_port()}/0")
    with chordbeat_web(nowhere, tmp_path, _users()) as web:
        client = web.client()
        r = web.log_in(client, *ADMIN)
        assert r.status_code == 503
        assert "cannot reach Redis" in r.text
        page = client.get(web.url + "/", allow_redirects=False, timeout=10)
        assert page.status_code == 302 and page.headers["Location"].startswith("/login")


def _waiting_queries(port: int) -> int:
    """Bytes sent to the Redis on ``port`` that it has not read (it is frozen): queries waiting."""
    listing = subprocess.run(
        ["ss", "-tnH", "state", "established", f"( sport = :{port} )"], capture_output=True, text=True, check=True
    )
    return sum(int(line.split()[0]) for line in listing.stdout.splitlines() if line.strip())


def test_a_frozen_redis_holds_the_request_that_needs_a_session_not_every_page(
    app: ChordbeatCelery, tmp_path: Path
) -> None:
    own = RedisServer()
    own.start()
    try:
        settings = dataclasses.replace(app.settings, broker_url=own.url)
        with chordbeat_web(settings, tmp_path, _users()) as web, ThreadPoolExecutor(2) as pool:
            signed_in, signing_in = web.client(), web.client()
            assert web.log_in(signed_in, *ADMIN).status_code == 302
            assert own.proc is not None
            own.proc.send_signal(signal.SIGSTOP)
            try:
                held = pool.submit(signed_in.get, web.url + "/", allow_redirects=False, timeout=30)
                wait_for(lambda: _waiting_queries(own.port) > 0, 10, what="the session lookup to wait on Redis")
                login = pool.submit(web.log_in, signing_in, *VIEWER)
                # A page that needs no session is answered meanwhile (on the event loop the lookup
                # held every request for the Redis client's 10 s socket timeout).
                login_page = requests.get(web.url + "/login", timeout=5)
                assert login_page.status_code == 200 and not held.done() and not login.done()
            finally:
                own.proc.send_signal(signal.SIGCONT)
            assert held.result().status_code == 200 and login.result().status_code == 302
    finally:
        own.stop()


def test_in_chromium_after_logout_back_and_reload_is_not_logged_in(web: LoginServer) -> None:
    with chromium() as driver:
        _log_in(driver, web)
        kept = driver.get_cookie("chordbeat_session")
        assert kept is not None
        driver.find_element(By.CSS_SELECTOR, "form[action='/logout'] button").click()
        wait_for(lambda: "/login" in driver.current_url, 20, what="the login page after logout")
        driver.back()
        driver.refresh()
        wait_for(lambda: driver.find_elements(By.NAME, "password"), 20, what="the login form again")
        assert not driver.find_elements(By.CSS_SELECTOR, "table.schedules")
        # The session cookie put back as it was before the logout: still not logged in.
        driver.add_cookie({"name": kept["name"], "value": kept["value"], "path": "/"})
        driver.get(web.url + "/")
        wait_for(lambda: driver.find_elements(By.NAME, "password"), 20, what="the login form for the replayed cookie")


def _log_in(driver: WebDriver, web: LoginServer) -> None:
    driver.get(web.url + "/")
    driver.find_element(By.NAME, "username").send_keys(ADMIN[0])
    driver.find_element(By.NAME, "password").send_keys(ADMIN[1])
    driver.find_element(By.ID, "login").click()
    wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, "table.schedules"), 20, what="the schedules page")


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


#: An anonymous login body of 60 MB raised the dashboard's memory by 120 MB: it was read whole.
HUGE_BODY = b"username=ops&password=" + b"x" * (60 * 1024 * 1024)


def test_a_60_mb_login_body_is_refused_413_unread_and_a_chunked_one_stops_at_the_limit(web: LoginServer) -> None:
    session = web.client()
    before = _rss_bytes(web.pid)
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    refused = session.post(f"{web.url}/login", data=HUGE_BODY, headers=form, timeout=30)
    assert refused.status_code == 413, refused.text[:200]
    assert "too large" in refused.text

    def chunked() -> Iterator[bytes]:
        view = memoryview(HUGE_BODY)
        for start in range(0, len(view), 1024 * 1024):
            yield bytes(view[start : start + 1024 * 1024])

    try:
        answer = session.post(f"{web.url}/login", data=chunked(), headers=form, timeout=30)
    except requests.ConnectionError:
        pass  # tornado answers 400 and closes the connection while the client still sends
    else:
        assert answer.status_code == 400, answer.text[:200]
    grown = _rss_bytes(web.pid) - before
    assert grown < 8 * 1024 * 1024, f"the dashboard grew by {grown} bytes"
    # Ordinary requests are served as before.
    assert web.log_in(web.client(), *ADMIN).status_code == 302
