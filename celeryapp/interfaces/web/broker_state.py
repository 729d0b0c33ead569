"""What the dashboard's health page reads from Redis and the workers: not in the database."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import redis
from kombu.exceptions import OperationalError

from celeryapp.application import ChordbeatCelery
from celeryapp.domain.names import CONTROL_QUEUE, PUBLIC_QUEUE, STEPS_QUEUE
from celeryapp.messaging import keys
from celeryapp.messaging.redis_client import get_redis
from celeryapp.messaging.reference_time import ClockCorrection, shared_correction

PING_TIMEOUT_S = 1.0
#: The workers' answers are shown this long before they are asked again. A ping waits its whole
#: timeout whoever answers, so the page never waits for one once it has answers: it shows the last
#: ones (saying how old they are) and asks again in the background.
PING_MAX_AGE_S = 5.0
#: Answers older than this are not shown as current (a page first opened long after the last one
#: showed 84 s old answers as alive): the page waits for a fresh ping instead.
PING_STALE_S = 15.0
#: What a broadcast raises when Redis is away or dropped a pooled connection.
BROKER_ERRORS = (redis.RedisError, OperationalError, OSError)


@dataclass
class BrokerState:
    workers: list[str]
    queues: dict[str, int]
    error: str | None = None
    #: Seconds since the workers answered the ping the list comes from.
    workers_age_s: float = 0.0
    #: The correction after a jump of Redis's clock, while it is being taken back.
    clock_correction: ClockCorrection | None = None
    #: The workers' answers the list comes from (health_lines.py's worker lines read them).
    pings: PingAnswers | None = None


@dataclass(frozen=True)
class PingAnswers:
    workers: list[str]
    error: str | None
    #: ``time.monotonic()`` when the ping was sent.
    asked_at: float


class WorkerPings:
    """The workers' last answers to a ping, for every page of one dashboard server. Only the
    first call waits for a ping; later ones get the last answers at once and, when those are
    older than ``max_age_s``, start one ping in the background (never two at a time). Answers
    older than ``stale_after_s`` are not shown: that call waits for a fresh ping."""

    def __init__(self, max_age_s: float = PING_MAX_AGE_S, stale_after_s: float = PING_STALE_S) -> None:
        self.max_age_s = max_age_s
        self.stale_after_s = stale_after_s
        self._lock = threading.Lock()
        self._last: PingAnswers | None = None
        self._asking = False

    def answers(self, app: ChordbeatCelery) -> PingAnswers:
        with self._lock:
            last = self._last
            if last is not None and time.monotonic() - last.asked_at > self.stale_after_s:
                last = None
            stale = last is None or time.monotonic() - last.asked_at > self.max_age_s
            ask_in_background = last is not None and stale and not self._asking
            self._asking = self._asking or ask_in_background
        if last is None:
            return self._ask(app)
        if ask_in_background:
            threading.Thread(target=self._ask, args=(app,), name="chordbeat-ping", daemon=True).start()
        return last

    def _ask(self, app: ChordbeatCelery) -> PingAnswers:
        asked_at = time.monotonic()
        try:
            replies = _ping(app)
            answers = PingAnswers(sorted(node for reply in replies for node in reply), None, asked_at)
        except BROKER_ERRORS as exc:
            answers = PingAnswers([], f"workers could not be asked: {exc}", asked_at)
        except BaseException:
            with self._lock:  # a later page asks again
                self._asking = False
            raise
        with self._lock:
            if self._last is None or self._last.asked_at <= asked_at:
                self._last = answers
            self._asking = False
        return answers


def queue_depth(client: redis.Redis, queue: str, priorities: list[int]) -> int:
    with client.pipeline(transaction=False) as pipe:
        for priority in priorities:
            pipe.llen(keys.priority_queue_key(queue, priority))
        return sum(int(n) for n in pipe.execute())


def broker_state(app: ChordbeatCelery, extra_queues: list[str], pings: WorkerPings) -> BrokerState:
    priorities = list(app.conf.broker_transport_options.get("priority_steps", [0]))
    queues = [CONTROL_QUEUE, PUBLIC_QUEUE, STEPS_QUEUE, *sorted(set(extra_queues) - {STEPS_QUEUE})]
    try:
        client = get_redis(app.settings.broker_url)
        depths = {q: queue_depth(client, q, priorities) for q in queues}
        correction = shared_correction(client)
    except redis.RedisError as exc:
        return BrokerState([], {}, error=f"Redis: {exc}")
    answers = pings.answers(app)
    age = time.monotonic() - answers.asked_at
    correcting = correction if correction is not None and correction.remaining_s != 0 else None
    return BrokerState(answers.workers, depths, answers.error, age, correcting, answers)


def _ping(app: ChordbeatCelery) -> list[dict[str, object]]:
    """Workers' answers to a ping. A pooled connection Redis closed meanwhile (a restart, an idle
    timeout) fails once; the second try takes a fresh one, so the page is not an error for it."""
    try:
        return app.control.ping(timeout=PING_TIMEOUT_S) or []
    except BROKER_ERRORS:
        return app.control.ping(timeout=PING_TIMEOUT_S) or []
