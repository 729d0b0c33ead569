"""The reference clock (Redis's TIME) jumping: time goes on without the step, the same in every
process, and slowly meets the reference again."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from celeryapp.application import ChordbeatCelery
from celeryapp.client import ChordbeatClient
from celeryapp.clock import ReferenceClock, clock
from celeryapp.clock_correction import (
    CORRECTION_KEY,
    JUMP_THRESHOLD_S,
    NO_CORRECTION,
    SLEW_RATE,
    BadCorrection,
    Correction,
)
from celeryapp.domain.names import PREFIX
from celeryapp.execution.steps import claim_step
from celeryapp.interfaces import service
from celeryapp.messaging import reference_time
from celeryapp.messaging.redis_client import get_redis
from celeryapp.monitoring.metrics import ExecutionCollector
from celeryapp.recovery.heartbeat_trust import RECOVERY_SEEN_KEY
from celeryapp.recovery.recovery import recover
from models import WorkerTask, transaction, utcnow
from tests.support.helpers import start_and_hold, step
from tests.support.servers import wait_for
from tests.support.web_server import ADMIN, WebServer, text_of

# --- the correction's arithmetic --------------------------------------------------------------

NOW = 1_800_000_000.0
jumps = st.floats(min_value=-7200, max_value=7200).filter(lambda j: abs(j) > JUMP_THRESHOLD_S)
gaps = st.floats(min_value=0.001, max_value=30.0)


def corrected_series(steps: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(raw, corrected) at each reading of a process that reads every ``gap`` seconds while the raw
    reference also jumps by ``jump`` (0: none) just before that reading."""
    correction, raw, out = NO_CORRECTION, NOW, []
    for gap, jump in steps:
        expected = raw + gap
        raw = expected + jump
        if abs(jump) > JUMP_THRESHOLD_S:
            correction = correction.after_jump(expected, raw)
        out.append((raw, correction.corrected(raw)))
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(gaps, st.one_of(st.just(0.0), jumps)), min_size=1, max_size=40))
def test_corrected_time_never_steps_and_never_goes_back(steps: list[tuple[float, float]]) -> None:
    """However the reference jumps (back, forward, again while the last is being taken back), the
    corrected time advances by the elapsed time within the slew, never by the jump."""
    previous = NOW
    for (gap, _jump), (_raw, corrected) in zip(steps, corrected_series(steps), strict=True):
        advance = corrected - previous
        assert advance > 0, "monotone"
        assert abs(advance - gap) <= SLEW_RATE * gap + 1e-6, (advance, gap)
        previous = corrected


@settings(max_examples=200, deadline=None)
@given(jumps, st.floats(min_value=-7200, max_value=7200))
def test_a_correction_is_taken_back_entirely_and_then_subtracts_nothing(jump: float, earlier: float) -> None:
    before = NO_CORRECTION
    if abs(earlier) > JUMP_THRESHOLD_S:
        before = NO_CORRECTION.after_jump(NOW - 10, NOW - 10 + earlier)
    correction = before.after_jump(NOW, NOW + jump)
    assert correction.corrected(NOW + jump) == pytest.approx(before.corrected(NOW), abs=1e-6), "continuous"
    done = correction.done_at()
    assert correction.remaining_s(done) == pytest.approx(0, abs=1e-6)
    assert correction.corrected(done + 1) == done + 1, "meets the raw reference"
    # Half-way, half of it is left: taken back at the slew rate, not at once.
    half = correction.at_reference_s + (done - correction.at_reference_s) / 2
    assert abs(correction.remaining_s(half)) == pytest.approx(abs(correction.jump_s) / 2, rel=1e-6)


def test_two_minutes_forward_are_taken_back_in_about_17_hours() -> None:
    correction = NO_CORRECTION.after_jump(NOW, NOW + 120)
    assert correction.jumps == 1 and correction.last_jump_s == 120
    assert (correction.done_at() - correction.at_reference_s) / 3600 == pytest.approx(120 / SLEW_RATE / 3600)
    assert correction.corrected(NOW + 120 + 3600) == pytest.approx(NOW + 3600 + 3600 * SLEW_RATE)


def test_a_record_round_trips_and_a_garbled_one_is_refused_naming_the_field() -> None:
    assert CORRECTION_KEY.startswith(f"{PREFIX}:")
    correction = NO_CORRECTION.after_jump(NOW, NOW - 30.5)
    assert Correction.from_text(correction.to_text()) == correction
    for text, field in [
        ("[]", "object"),
        ("{", "JSON"),
        ('{"jump_s": "x"}', "jump_s"),
        ('{"jump_s": 1, "at_reference": 1, "slew": 2, "jumps": 1, "last_jump_s": 1}', "slew"),
        ('{"jump_s": 1, "at_reference": 1, "slew": 0.002, "jumps": -1, "last_jump_s": 1}', "jumps"),
        ('{"jump_s": 1e300, "at_reference": 1, "slew": 0.002, "jumps": 1, "last_jump_s": 1}', "jump_s"),
    ]:
        with pytest.raises(BadCorrection, match=field):
            Correction.from_text(text)


# --- processes sharing one reference ----------------------------------------------------------


class Reference:
    """A reference server of the test's: a true clock shifted by ``shift_s``, and the stored record."""

    def __init__(self) -> None:
        self.shift_s = 0.0
        self.stored: str | None = None

    def read(self) -> tuple[float, str | None]:
        return time.time() + self.shift_s, self.stored

    def share(self, expected: str | None, correction: str) -> str | None:
        if self.stored == expected:
            self.stored = correction
        return self.stored


def clock_on(reference: Reference) -> ReferenceClock:
    clock = ReferenceClock()
    clock.use(reference)
    clock.measure()
    return clock


@pytest.mark.parametrize("jump_s", [120.0, -120.0, 30.0, -30.0])
def test_every_process_keeps_one_continuous_time_across_a_jump(jump_s: float, caplog: pytest.LogCaptureFixture) -> None:
    """The first reader records the correction; another that read before the jump takes it at its
    next reading, and one started after the jump takes it at its first: all agree with the time
    the jump interrupted."""
    reference = Reference()
    beat, worker = clock_on(reference), clock_on(reference)
    reference.shift_s = jump_s
    with caplog.at_level(logging.ERROR, logger="celeryapp.clock"):
        beat.measure()
    assert abs(beat.timestamp() - time.time()) < 0.05, "no step"
    assert [r.levelno for r in caplog.records] == [logging.ERROR]
    assert f"jumped {abs(jump_s):.1f} s {'forward' if jump_s > 0 else 'back'}" in caplog.text
    assert abs(worker.timestamp() - time.time()) < 0.05, "not read since: the old reading goes on"
    worker.measure()
    started_since = clock_on(reference)
    for other in (worker, started_since):
        assert abs(other.timestamp() - time.time()) < 0.05
        assert other.correction == beat.correction and other.correction.jumps == 1
    assert len(caplog.records) == 1, "adopting a recorded correction logs nothing"


def test_a_jump_seen_by_two_processes_at_once_is_recorded_once() -> None:
    reference = Reference()
    first, second = clock_on(reference), clock_on(reference)
    reference.shift_s = 60.0
    raced = reference.read

    def read_then_lose_the_race() -> tuple[float, str | None]:
        found = raced()
        first.measure()  # records its correction between the second's read and its write
        return found

    reference.read = read_then_lose_the_race  # type: ignore[method-assign]
    second.measure()
    assert second.correction == first.correction and second.correction.jumps == 1
    assert abs(second.timestamp() - time.time()) < 0.05


def test_a_second_jump_while_the_first_is_taken_back_adds_to_it() -> None:
    reference = Reference()
    clock = clock_on(reference)
    reference.shift_s = 120.0
    clock.measure()
    reference.shift_s = 20.0  # back by 100 s: 20 s of the first remain to take back
    clock.measure()
    assert clock.correction.jumps == 2 and clock.correction.last_jump_s == pytest.approx(-100, abs=0.05)
    assert clock.correction.jump_s == pytest.approx(20, abs=0.05)
    assert abs(clock.timestamp() - time.time()) < 0.05


def test_a_lost_record_is_written_back_so_that_the_jump_does_not_reappear(caplog: pytest.LogCaptureFixture) -> None:
    """Redis restarted without its data: every process that knew the correction writes it back."""
    reference = Reference()
    clock = clock_on(reference)
    reference.shift_s = -120.0
    clock.measure()
    recorded = reference.stored
    reference.stored = None
    with caplog.at_level(logging.WARNING, logger="celeryapp.clock"):
        clock.measure()
    assert reference.stored == recorded and "written back" in caplog.text
    assert abs(clock.timestamp() - time.time()) < 0.05
    assert abs(clock_on(reference).timestamp() - time.time()) < 0.05, "a process started since agrees"


def test_a_garbled_record_is_replaced_and_time_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    reference = Reference()
    clock = clock_on(reference)
    reference.shift_s = 30.0
    clock.measure()
    recorded = reference.stored
    reference.stored = '{"jump_s": "soon"}'
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="celeryapp.clock"):
        clock.measure()
        clock.measure()
    assert reference.stored == recorded, "replaced by the correction in force"
    assert len(caplog.records) == 1 and "jump_s: not a number" in caplog.text
    assert abs(clock.timestamp() - time.time()) < 0.05


def test_a_reading_within_the_threshold_is_no_jump() -> None:
    reference = Reference()
    clock = clock_on(reference)
    reference.shift_s = JUMP_THRESHOLD_S / 2
    clock.measure()
    assert clock.correction == NO_CORRECTION and reference.stored is None


@pytest.fixture
def app(app: ChordbeatCelery) -> Iterator[ChordbeatCelery]:
    """The app, and afterwards no correction left in the session's Redis nor in this process's
    clock: the tests that follow keep Redis's time."""
    yield app
    get_redis(app.settings.broker_url).delete(CORRECTION_KEY)
    reference_time.install(app.settings.broker_url)


def test_redis_keeps_the_correction_by_compare_and_set(app: ChordbeatCelery) -> None:
    """The real store: TIME and the record in one round trip; a write expecting another record stores nothing."""
    shared = reference_time.RedisReference(app.settings.broker_url)
    raw_s, stored = shared.read()
    assert abs(raw_s - time.time()) < 1 and stored is None
    first = NO_CORRECTION.after_jump(raw_s, raw_s + 30).to_text()
    assert shared.share(None, first) == first
    assert shared.share(None, "late") == first, "expected none, found one: not replaced"
    second = Correction.from_text(first).after_jump(raw_s + 40, raw_s).to_text()
    assert shared.share(first, second) == second
    assert shared.read()[1] == second
    shown = reference_time.shared_correction(get_redis(app.settings.broker_url))
    assert shown is not None and shown.correction == Correction.from_text(second)
    assert shown.correction.jumps == 2 and shown.remaining_s == pytest.approx(-10, abs=0.5)


def test_a_jump_is_counted_exported_and_shown_on_the_health_page(app: ChordbeatCelery) -> None:
    client = get_redis(app.settings.broker_url)
    raw_s = reference_time.read_reference(app.settings.broker_url)
    client.set(CORRECTION_KEY, NO_CORRECTION.after_jump(raw_s - 120, raw_s).to_text())
    clock.measure()  # this process adopts it, as every process does at its next reading
    families = {family.name: family for family in ExecutionCollector(app).collect()}
    assert [s.value for s in families["chordbeat_clock_jumps"].samples] == [1]
    assert 119 < families["chordbeat_clock_correction_seconds"].samples[0].value <= 120
    with WebServer(app) as web:
        health = text_of(web.session(ADMIN).get(web.url + "/health", timeout=10).text)
    assert "Redis's clock jumped 2 min forward" in health, health
    assert "(1 jump so far)" in health and "behind Redis's clock, taken back at 0.2 % (done in 16 h" in health, health


def test_a_service_call_made_after_redis_clock_jumped_back_is_not_dropped_as_expired(
    app: ChordbeatCelery, worker: Any
) -> None:
    """ChordbeatClient wrote its calls' expiry by Redis's raw clock: two minutes behind chordbeat's
    time after a jump back, every call had expired before a worker took it."""
    service.apply_schedule(app, {"name": "called", "every": 3600, "steps": [step("s")]})
    raw_s = reference_time.read_reference(app.settings.broker_url)
    correction = NO_CORRECTION.after_jump(raw_s + 120, raw_s)
    get_redis(app.settings.broker_url).set(CORRECTION_KEY, correction.to_text())
    clock.measure()  # the worker (in this process) adopts it
    assert clock.correction == correction
    caller = ChordbeatClient(app.settings.broker_url, app.settings.result_backend, timeout_s=10)
    assert caller.call("chordbeat.trigger_schedule", name="called")["execution_id"] is not None


class ShiftedRedisReference(reference_time.RedisReference):
    """The real Redis's TIME, ``shift_s`` off: a jump of its clock as this process sees it."""

    shift_s = 0.0

    def read(self) -> tuple[float, str | None]:
        raw_s, stored = super().read()
        return raw_s + self.shift_s, stored


def test_recovery_takes_no_step_for_lost_just_after_redis_clock_jumped_forward(app: ChordbeatCelery) -> None:
    """Redis expires keys by its own clock: a jump forward longer than a heartbeat's time to live
    expired every heartbeat at once, and a recovery pass before the steps wrote them again took
    every step that had run a TTL for lost (stopped and run again)."""
    service.apply_schedule(app, {"name": "running", "every": 3600, "steps": [step("a")]})
    reference = ShiftedRedisReference(app.settings.broker_url)
    clock.use(reference)
    clock.measure()
    execution_id, _effects = start_and_hold(app, "running")
    past = utcnow() - timedelta(seconds=60)
    with transaction(app.settings.database_url) as session:
        task_id = session.scalar(select(WorkerTask.id).where(WorkerTask.execution_id == execution_id))
        assert task_id is not None
        assert claim_step(session.connection(), task_id, 1, node="beating@host", now=past) is not None
    client = get_redis(app.settings.broker_url)
    client.set(RECOVERY_SEEN_KEY, "1", ex=60)  # recovery has been running all along
    reference.shift_s = 20.0  # the jump: its heartbeat expired with it
    assert recover(app).requeued == [], "a heartbeat expired by the jump is not a lost worker"
    assert clock.jumped_forward_within(app.settings.heartbeat_ttl_s)
    # One TTL on, a heartbeat still missing is a lost worker again.
    wait_for(lambda: recover(app).requeued == [task_id], 10, interval=0.2, what="the step taken for lost")
