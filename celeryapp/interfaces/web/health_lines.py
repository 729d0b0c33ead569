""" "Is everything up": one line per part of a deployment, each saying what it answered (or why it
is down) and how old that answer is.

The database and each Redis are asked when the lines are made, with short timeouts of their own
(a part that hangs costs the page ``PROBE_TIMEOUT_S``, not the clients' usual 10 s); the workers
speak through the registry they refresh (monitoring/worker_registry.py) and the last ping; beat
through its lock; every process through the offset it noted of its host's clock. Flower and the
metrics endpoint are asked over HTTP when their addresses are configured. Nothing here raises for
a part that is down: that part's line says so.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from celeryapp.application import REDBEAT_LOCK_TIMEOUT_S, ChordbeatCelery
from celeryapp.clock import clock
from celeryapp.config import Settings
from celeryapp.domain.times import span
from celeryapp.interfaces.web.broker_state import PingAnswers
from celeryapp.messaging.reference_time import OFFSET_WARNING_S, offsets
from celeryapp.monitoring import worker_registry
from celeryapp.recovery.signals import HEALTH_INTERVAL_S
from celeryapp.redis_urls import is_sentinel, parse_sentinels
from celeryapp.scheduling.beat_lock import holder_of
from models import transaction

#: Seconds one part may take to answer before its line says it does not.
PROBE_TIMEOUT_S = 2.0
#: A worker whose registry entry was not refreshed for this long has missed two refreshes.
WORKER_LATE_S = 2.5 * HEALTH_INTERVAL_S
UP, DOWN, LATE, OFF = "up", "down", "late", "off"


@dataclass(frozen=True)
class HealthLine:
    #: What the line is about, as people name it ("Database", "Redis (broker, sessions)").
    part: str
    #: ``up``, ``down``, ``late`` (answers, but something is off) or ``off`` (not configured).
    state: str
    #: What it answered, or why it is down.
    said: str
    #: ``time.monotonic()`` of the answer shown (its age is said beside it).
    answered_at: float
    link: str | None = None

    def age_s(self, now_monotonic: float | None = None) -> float:
        return max((time.monotonic() if now_monotonic is None else now_monotonic) - self.answered_at, 0.0)

    @property
    def word(self) -> str:
        """The state as its badge says it (a worker that answers is "alive")."""
        if self.part.startswith("Worker ") and self.state == UP:
            return "alive"
        return {UP: "up", DOWN: "down", LATE: "late", OFF: "not set"}[self.state]

    def age_words(self, now_monotonic: float | None = None) -> str:
        """``checked now``, ``3 s ago``: how old the answer shown is."""
        age = self.age_s(now_monotonic)
        return "checked now" if age < 1 else f"{span(round(age))} ago"


def _reason(exc: BaseException) -> str:
    """An error's first line, without the driver's SQL or hints: what a person needs to act on."""
    inner = getattr(exc, "orig", None) or exc
    first = (str(inner).strip().splitlines() or [type(inner).__name__])[0]
    return first[:300]


def database_line(settings: Settings) -> HealthLine:
    started = time.monotonic()
    try:
        with transaction(settings.database_url, read_only=True) as session:
            session.execute(text("SELECT 1"))
    except SQLAlchemyError as exc:
        return HealthLine("Database", DOWN, f"does not answer: {_reason(exc)}", time.monotonic())
    took = time.monotonic() - started
    return HealthLine("Database", UP, f"answers (round trip {took * 1000:.0f} ms)", time.monotonic())


def _where(url: str) -> str:
    """A Redis URL's address without its credentials."""
    if is_sentinel(url):
        return "Sentinels " + ", ".join(f"{host}:{port}" for host, port in parse_sentinels(url).addresses)
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path
    return f"{parts.hostname}:{parts.port or 6379}{parts.path or '/0'}"


def _probe_options() -> dict[str, object]:
    return {
        "socket_timeout": PROBE_TIMEOUT_S,
        "socket_connect_timeout": PROBE_TIMEOUT_S,
        "retry": Retry(NoBackoff(), 0),
        "decode_responses": True,
    }


def _redis_of(url: str, master: str) -> tuple[redis.Redis, str]:
    """A short-lived client of the Redis ``url`` names, and the primary's address when Sentinels
    name it."""
    if not is_sentinel(url):
        return redis.Redis.from_url(url, **_probe_options()), ""  # type: ignore[arg-type]
    sentinels = parse_sentinels(url)
    short = {"socket_timeout": PROBE_TIMEOUT_S, "socket_connect_timeout": PROBE_TIMEOUT_S}
    manager = Sentinel(list(sentinels.addresses), sentinel_kwargs=short, **short)  # type: ignore[no-untyped-call]
    host, port = manager.discover_master(master)  # type: ignore[no-untyped-call]
    client = redis.Redis(
        host=host,
        port=port,
        db=sentinels.db,
        username=sentinels.username,
        password=sentinels.password,
        **_probe_options(),  # type: ignore[arg-type]
    )
    return client, f"; the Sentinels name primary {master!r} at {host}:{port}"


def redis_roles(settings: Settings) -> dict[str, list[str]]:
    """Each distinct Redis URL and what it serves, in the settings' order."""
    roles: dict[str, list[str]] = {}
    for url, role in (
        (settings.broker_url, "broker"),
        (settings.broker_url, "sessions"),
        (settings.result_backend, "results"),
        (settings.redbeat_url, "RedBeat"),
    ):
        roles.setdefault(url, []).append(role)
    return roles


def redis_line(url: str, roles: list[str], master: str) -> HealthLine:
    part = f"Redis ({', '.join(roles)})"
    started = time.monotonic()
    try:
        client, primary = _redis_of(url, master)
        try:
            client.ping()
        finally:
            client.close()
    except redis.RedisError as exc:
        return HealthLine(part, DOWN, f"{_where(url)} does not answer: {_reason(exc)}", time.monotonic())
    took = time.monotonic() - started
    return HealthLine(part, UP, f"{_where(url)} answers (round trip {took * 1000:.0f} ms){primary}", time.monotonic())


def beat_lock_line(app: ChordbeatCelery) -> HealthLine:
    """Who holds beat's lock and for how long yet; each tick extends it to ``REDBEAT_LOCK_TIMEOUT_S``."""
    part = "Beat lock"
    key = f"{app.conf.redbeat_key_prefix}:lock"
    try:
        client, _primary = _redis_of(app.settings.redbeat_url, app.settings.sentinel_master)
        try:
            with client.pipeline(transaction=False) as pipe:
                pipe.get(key)
                pipe.pttl(key)
                token, ttl_ms = pipe.execute()
        finally:
            client.close()
    except redis.RedisError as exc:
        return HealthLine(part, DOWN, f"unknown: RedBeat's Redis does not answer ({_reason(exc)})", time.monotonic())
    if token is None or int(ttl_ms) <= 0:
        return HealthLine(part, DOWN, "no beat holds the lock: nothing fires schedules", time.monotonic())
    ttl_s = int(ttl_ms) / 1000
    holder = holder_of(str(token)) or "a beat that does not name itself"
    since_tick = max(REDBEAT_LOCK_TIMEOUT_S - ttl_s, 0.0)
    # The lock's time to live is the freshness: the holder extended it this long ago.
    return HealthLine(
        part,
        UP,
        f"held by {holder}; expires in {ttl_s:.0f} s unless extended",
        time.monotonic() - since_tick,
    )


def worker_lines(settings: Settings, pings: PingAnswers) -> list[HealthLine]:
    """One line per worker that published itself in the registry or answered the last ping. The
    registry's refresh (every ``HEALTH_INTERVAL_S``) is the freshness shown; a worker that did not
    answer the last ping, or stopped refreshing, is not shown as up."""
    now = time.monotonic()
    try:
        client, _primary = _redis_of(settings.broker_url, settings.sentinel_master)
        try:
            nodes = [entry.node for entry in worker_registry.live_workers(client)]
            refreshed = worker_registry.refreshed_ago_s(client, nodes)
        finally:
            client.close()
    except redis.RedisError as exc:
        refreshed = {}
        registry_error: str | None = _reason(exc)
    else:
        registry_error = None
    pinged_ago = now - pings.asked_at
    lines = []
    for node in sorted(set(refreshed) | set(pings.workers)):
        answered = node in pings.workers
        ping = (
            f"answered the ping {pinged_ago:.0f} s ago"
            if answered
            else ("not asked: " + pings.error if pings.error else f"did not answer the ping {pinged_ago:.0f} s ago")
        )
        if node in refreshed:
            ago = refreshed[node]
            late = ago > WORKER_LATE_S
            said = f"refreshed its registry entry {ago:.0f} s ago{' (late)' if late else ''}; {ping}"
            state = UP if answered and not late else LATE
            lines.append(HealthLine(f"Worker {node}", state, said, now - ago))
        else:
            said = f"not in the registry ({registry_error or 'no entry'}); {ping}"
            lines.append(HealthLine(f"Worker {node}", LATE, said, pings.asked_at))
    if not lines:
        why = registry_error or pings.error or "none published itself or answered a ping"
        lines.append(HealthLine("Workers", DOWN, f"no worker: {why}", pings.asked_at))
    return lines


def clock_lines(settings: Settings) -> list[HealthLine]:
    """Each process's host clock against the reference (Redis's), as it last noted it."""
    try:
        client, _primary = _redis_of(settings.broker_url, settings.sentinel_master)
        try:
            now_s = clock.timestamp()
            noted = offsets(client, now_s)
        finally:
            client.close()
    except redis.RedisError as exc:
        return [HealthLine("Clock offsets", DOWN, f"unknown: Redis does not answer ({_reason(exc)})", time.monotonic())]
    if not noted:
        return [HealthLine("Clock offsets", OFF, "no process noted its clock yet", time.monotonic())]
    now = time.monotonic()
    lines = []
    for entry in noted:
        off = abs(entry.offset_s) > OFFSET_WARNING_S
        way = "ahead of" if entry.offset_s > 0 else "behind"
        size = f"{abs(entry.offset_s):.1f} s" if abs(entry.offset_s) >= 1 else f"{abs(entry.offset_s) * 1000:.0f} ms"
        said = f"its host's clock is {size} {way} Redis's" + (
            f" (over {OFFSET_WARNING_S:g} s: fix the host's time sync)" if off else ""
        )
        lines.append(HealthLine(f"Clock of {entry.process}", LATE if off else UP, said, now - (now_s - entry.at)))
    return lines


def _http_line(part: str, url: str | None, path: str, expect: Callable[[str], bool], link: bool) -> HealthLine:
    if url is None:
        variable = "CHORDBEAT_FLOWER_URL" if part == "Flower" else "CHORDBEAT_METRICS_URL"
        return HealthLine(part, OFF, f"not configured ({variable} is unset)", time.monotonic())
    target = url + path
    started = time.monotonic()
    try:
        with urllib.request.urlopen(target, timeout=PROBE_TIMEOUT_S) as response:
            body = response.read(64 * 1024).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return HealthLine(part, DOWN, f"{target} answered HTTP {exc.code}", time.monotonic(), url if link else None)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        why = getattr(exc, "reason", exc)
        return HealthLine(part, DOWN, f"{target} does not answer: {why}", time.monotonic(), url if link else None)
    took = time.monotonic() - started
    if not expect(body):
        return HealthLine(part, LATE, f"{target} answers, but not as expected", time.monotonic(), url if link else None)
    return HealthLine(
        part, UP, f"{target} answers (round trip {took * 1000:.0f} ms)", time.monotonic(), url if link else None
    )


def flower_line(settings: Settings) -> HealthLine:
    return _http_line("Flower", settings.flower_url, "/healthcheck", lambda body: body.strip() == "OK", link=True)


def metrics_line(settings: Settings) -> HealthLine:
    return _http_line("Metrics", settings.metrics_url, "", lambda body: "chordbeat_" in body, link=False)


def health_lines(app: ChordbeatCelery, pings: PingAnswers) -> list[HealthLine]:
    """Every line, in the order the page shows them. The parts are asked at the same time: parts
    that are down cost the page one ``PROBE_TIMEOUT_S``, not one each."""
    settings = app.settings
    asks: list[Callable[[], list[HealthLine]]] = [
        lambda: [database_line(settings)],
        *(
            (lambda url=url, roles=roles: [redis_line(url, roles, settings.sentinel_master)])
            for url, roles in redis_roles(settings).items()
        ),
        lambda: [beat_lock_line(app)],
        lambda: worker_lines(settings, pings),
        lambda: [flower_line(settings)],
        lambda: [metrics_line(settings)],
        lambda: clock_lines(settings),
    ]
    with ThreadPoolExecutor(max_workers=len(asks), thread_name_prefix="chordbeat-health") as pool:
        return [line for lines in pool.map(lambda ask: ask(), asks) for line in lines]
