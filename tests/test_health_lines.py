"""The Health page's lines, "is everything up": the database, each Redis, beat's lock holder,
each worker's freshness, Flower, the metrics endpoint and the processes' clocks, each with the
age of its answer; a part that is down is a line saying why, never an error page."""

from __future__ import annotations

import dataclasses
import html
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from prometheus_client import CollectorRegistry, start_http_server

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.interfaces.web.broker_state import PingAnswers, WorkerPings
from celeryapp.interfaces.web.health_lines import HealthLine, database_line, health_lines, redis_line
from celeryapp.monitoring.metrics import ExecutionCollector
from celeryapp.scheduling.beat_lock import holder_token
from tests.support.sentinel import SentinelCluster
from tests.support.servers import RedisServer, free_port
from tests.support.web_server import ADMIN, WebServer, text_of


def _by_part(lines: list[HealthLine]) -> dict[str, HealthLine]:
    return {line.part: line for line in lines}


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def settings_applied(app: ChordbeatCelery) -> Iterator[Any]:
    """Change the app's settings for one test; the app fixture's come back afterwards."""
    before = app.settings

    def apply(**changes: Any) -> Settings:
        changed = dataclasses.replace(before, **changes)
        app.apply_settings(changed)
        return changed

    yield apply
    app.apply_settings(before)


def test_every_part_has_a_line_with_its_age_and_a_worker_is_fresh(
    app: ChordbeatCelery, worker: Any, settings_applied: Any
) -> None:
    metrics_port = free_port()
    registry = CollectorRegistry()
    registry.register(ExecutionCollector(app))
    server, _thread = start_http_server(metrics_port, addr="127.0.0.1", registry=registry)
    try:
        settings_applied(
            metrics_url=f"http://127.0.0.1:{metrics_port}/metrics",
            flower_url=f"http://127.0.0.1:{free_port()}",  # nobody listens there
        )
        # A beat holds the lock as chordbeat's beat takes it: the token names the holder.
        client = redis.Redis.from_url(app.settings.redbeat_url)
        client.set(f"{app.conf.redbeat_key_prefix}:lock", holder_token(), px=30_000)
        pings = WorkerPings()
        lines = health_lines(app, pings.answers(app))
    finally:
        server.shutdown()
    parts = _by_part(lines)
    assert parts["Database"].state == "up" and "round trip" in parts["Database"].said
    redis_line = parts["Redis (broker, sessions, results, RedBeat)"]
    assert redis_line.state == "up" and f"127.0.0.1:{app.settings.broker_url.split(':')[2]}" in redis_line.said
    lock = parts["Beat lock"]
    assert lock.state == "up" and re.search(r"held by \S+ pid \d+; expires in (29|30) s", lock.said), lock.said
    node = parts[f"Worker {worker.hostname}"]
    assert node.state == "up" and node.word == "alive"
    assert re.fullmatch(r"refreshed its registry entry \d+ s ago; answered the ping \d+ s ago", node.said), node.said
    assert node.age_s() < 30
    flower = parts["Flower"]
    assert flower.state == "down" and "does not answer" in flower.said and "Connection refused" in flower.said
    assert flower.link == app.settings.flower_url  # the link is there even while Flower is down
    assert parts["Metrics"].state == "up" and "/metrics answers" in parts["Metrics"].said
    clocks = [line for line in lines if line.part.startswith("Clock")]
    offset = re.compile(r"its host's clock is [\d.]+ m?s (ahead of|behind) Redis's")
    assert clocks and all(offset.search(c.said) for c in clocks)
    assert all(line.age_words() for line in lines)


def test_a_stopped_redis_is_a_line_saying_why_and_the_page_still_answers(
    app: ChordbeatCelery, own_redis: RedisServer, settings_applied: Any
) -> None:
    """RedBeat's Redis stopped: its line and the lock's say so; the page is served (sessions
    live in the broker's Redis, which answers)."""
    settings_applied(redbeat_url=own_redis.url)
    with WebServer(app) as web:
        admin = web.session(ADMIN)
        up = html.unescape(text_of(admin.get(web.url + "/health", timeout=10).text))
        assert "Redis (RedBeat) up" in up and "Beat lock down no beat holds the lock" in up, up
        own_redis.stop()
        page = admin.get(web.url + "/health", timeout=20)
        fragment = admin.get(web.url + "/health/fragment", timeout=20)
    assert page.status_code == 200 and fragment.status_code == 200
    text = html.unescape(text_of(page.text))
    where = f"127.0.0.1:{own_redis.port}/0"
    assert re.search(rf"Redis \(RedBeat\) down {re.escape(where)} does not answer: .*Connection refused", text), text
    assert "Beat lock down unknown: RedBeat's Redis does not answer" in text, text
    assert "Redis (broker, sessions, results) up" in text


def test_a_broker_or_database_that_is_down_is_a_line_not_an_error(app: ChordbeatCelery, settings_applied: Any) -> None:
    stopped = f"redis://127.0.0.1:{free_port()}/0"
    settings_applied(broker_url=stopped, result_backend=stopped, redbeat_url=stopped)
    # The page's ping fails as the page's Redis reads do (broker_state.py): its answers say so.
    lines = health_lines(app, PingAnswers([], "workers could not be asked: Redis is down", time.monotonic()))
    parts = _by_part(lines)
    assert parts["Redis (broker, sessions, results, RedBeat)"].state == "down"
    assert "Connection refused" in parts["Redis (broker, sessions, results, RedBeat)"].said
    assert parts["Workers"].state == "down" and "Connection refused" in parts["Workers"].said
    assert parts["Clock offsets"].state == "down"
    assert parts["Flower"].state == "off" and "CHORDBEAT_FLOWER_URL is unset" in parts["Flower"].said


def test_a_database_that_is_down_leaves_the_page_up(app: ChordbeatCelery, settings_applied: Any, tmp_path: Any) -> None:
    settings_applied(database_url=f"sqlite:///{tmp_path}/no-such-dir/chordbeat.db")
    with WebServer(app) as web:
        page = web.session(ADMIN).get(web.url + "/health", timeout=20)
    assert page.status_code == 200, page.text
    text = html.unescape(text_of(page.text))
    assert re.search(r"Database down does not answer: unable to open database file", text), text
    assert "Not known: the database does not answer." in text


def test_a_postgresql_that_refuses_connections_is_a_line_saying_so(settings: Settings) -> None:
    """PostgreSQL's driver says it its own way: the line gives its first line, without the URL."""
    nobody = f"postgresql+psycopg://chordbeat:secret-word@127.0.0.1:{free_port()}/chordbeat"
    line = database_line(dataclasses.replace(settings, database_url=nobody))
    assert line.state == "down" and "Connection refused" in line.said and "secret-word" not in line.said, line


@pytest.mark.timeout(120)
def test_with_sentinels_the_redis_line_names_the_primary_they_name() -> None:
    cluster = SentinelCluster()
    cluster.start()
    try:
        line = redis_line(cluster.url, ["broker"], cluster.master)
        primary = cluster.primary()
    finally:
        cluster.close()
    assert line.state == "up" and line.part == "Redis (broker)", line
    assert line.said.startswith("Sentinels 127.0.0.1:") and "answers (round trip" in line.said, line
    assert line.said.endswith(f"the Sentinels name primary '{cluster.master}' at 127.0.0.1:{primary}"), line


def test_old_worker_answers_are_not_shown_as_current(app: ChordbeatCelery) -> None:
    """The page first opened long after the last one showed answers 84 s old as the workers'
    state; past ``stale_after_s`` the page waits for a fresh ping instead."""
    pings = WorkerPings(max_age_s=3600)
    first = pings.answers(app)
    pings.stale_after_s = 0.0
    assert pings.answers(app).asked_at > first.asked_at
