"""The alert sender in workers: only a control worker sends, the Redis lease's holder (or each of
them while Redis is away); it runs the deadline watch; a killed sender's successor delivers; a
receiver that hangs holds up no run."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from sqlalchemy import select, update

from celeryapp.alerting import sender_thread
from celeryapp.application import ChordbeatCelery
from celeryapp.clock import clock
from celeryapp.config import Settings
from models import Alert, DeliveryStatus, Schedule, transaction
from tests.support import alert_wiring, processes
from tests.support.alert_wiring import SECRET, alert, deliveries, hanging_server
from tests.support.helpers import call, finished, step
from tests.support.receivers import HttpReceiver, SmtpReceiver, http_receiver, smtp_receiver  # noqa: F401  (fixtures)
from tests.support.servers import free_port, wait_for

#: The alert tests' fixtures (tests/support/alert_wiring.py): a channels file, its variables naming the receivers.
settings = alert_wiring.settings
wired = alert_wiring.wired


def lease_holder(settings: Settings) -> str | None:
    """The node holding the alert sender's lease."""
    value: Any = redis.Redis.from_url(settings.broker_url).get(sender_thread.LEASE_KEY)
    return None if value is None else str(value.decode())


def test_a_worker_sends_a_runs_alert_and_a_hanging_receiver_holds_up_no_step(
    app: ChordbeatCelery,
    worker: Any,
    client: Celery,
    settings: Settings,
    wired: tuple[HttpReceiver, SmtpReceiver],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    http, _ = wired
    definition = {"name": "nightly-hr-sync", "every": 3600, "steps": [step("s", "chordbeat.examples.fail")]}
    call(client, "chordbeat.apply_schedule", definition=definition)
    call(client, "chordbeat.apply_schedule", definition={"name": "other", "every": 3600, "steps": [step("s")]})
    with transaction(settings.database_url) as session:
        session.execute(
            update(Schedule)
            .where(Schedule.name == "nightly-hr-sync")
            .values(alerts={"channels": ["stuck", "hook"], "on": ["failed"]})
        )
    with hanging_server() as url:
        monkeypatch.setenv("STUCK_URL", url)
        run = call(client, "chordbeat.trigger_schedule", name="nightly-hr-sync")["execution_id"]
        assert finished(client, run)["status"] == "failed"
        [got] = http.wait(1)
        other = call(client, "chordbeat.trigger_schedule", name="other")["execution_id"]
        assert finished(client, other)["status"] == "completed"
        key = f"failed/nightly-hr-sync/execution-{run}"
        # The hook's delivery and another run's steps went while the stuck channel waited.
        stuck = deliveries(settings, key)["stuck"]
        assert stuck.lease_until is not None and stuck.last_error is None
    body = got.json()
    assert body["id"] == key and got.signature_valid(SECRET)
    with transaction(settings.database_url) as session:
        decided = session.scalar(select(Alert.at).where(Alert.key == key))
    assert decided is not None
    print(f"fact -> receiver: {got.received_at - decided.timestamp():.3f} s")
    assert lease_holder(settings) == worker.hostname


def test_the_sender_runs_the_deadline_watch_with_the_configured_grace(
    settings: Settings, wired: tuple[HttpReceiver, SmtpReceiver]
) -> None:
    """The lease holder watches deadlines: an unfired slot 30 s old is missed with a grace of 5 s
    (the default's 120 s would say nothing yet), and the alert reaches the hook."""
    http, _ = wired
    quick = dataclasses.replace(settings, alert_missed_grace_s=5, alert_watch_interval_s=0.2)
    with transaction(settings.database_url) as session:
        session.add(
            Schedule(
                name="nightly-hr-sync",
                every_s=3600,
                next_run_at=clock.now() - timedelta(seconds=30),
                alerts={"channels": ["hook"], "on": ["missed"]},
            )
        )
    thread = sender_thread.SenderThread(quick, "watcher@test")
    thread.start()
    try:
        [got] = http.wait(1)
    finally:
        thread.stop()
    body = got.json()
    assert (body["kind"], body["detail"], body["schedule"]) == ("missed", "not_fired", "nightly-hr-sync")
    assert lease_holder(settings) is None  # released at stop


def test_alerts_are_sent_while_redis_cannot_be_asked_for_the_lease(
    settings: Settings, wired: tuple[HttpReceiver, SmtpReceiver]
) -> None:
    """Redis away is when beat and the steps stand still and the deadline watch matters most: the
    sender sends without the lease (the claims keep each send one)."""
    http, _ = wired
    away = dataclasses.replace(settings, broker_url=f"redis://127.0.0.1:{free_port()}/0")  # nothing listens
    key = alert(settings, ["hook"])
    thread = sender_thread.SenderThread(away, "cut-off@test")
    thread.start()
    try:
        [got] = http.wait(1)
    finally:
        thread.stop()
    assert got.json()["id"] == key and deliveries(settings, key)["hook"].status is DeliveryStatus.DELIVERED


@pytest.mark.timeout(120)
def test_a_killed_senders_successor_delivers_and_a_step_worker_never_sends(
    settings: Settings, tmp_path: Path, wired: tuple[HttpReceiver, SmtpReceiver]
) -> None:
    http, _ = wired
    env = {
        "CHORDBEAT_ALERT_CHANNELS": str(settings.alert_channels_file),
        "HOOK_URL": http.url,
        "HOOK_SECRET": SECRET,
        "CHORDBEAT_ALERT_POLL_INTERVAL": "0.2",
    }
    broken = tmp_path / "broken.yaml"
    broken.write_text("channels: [\n")
    # The first sender holds the lease but sends nothing (its channels file is being fixed): the
    # alert written next is due when it is killed, as if it died between the fact and the delivery.
    first = processes.start_worker(settings, tmp_path, "first", env={**env, "CHORDBEAT_ALERT_CHANNELS": str(broken)})
    try:
        wait_for(lambda: lease_holder(settings), 60, interval=0.1, what="the first sender's lease")
        wait_for(lambda: "channels file is fixed" in first.output(), 30, what="the first sender to read its file")
        key = alert(settings, ["hook"])
    finally:
        first.kill()
    killed = clock.now()
    assert (lease_holder(settings) or "").startswith("first@")
    with (
        processes.step_worker(settings, tmp_path, env=env) as steps,
        processes.control_worker(settings, tmp_path, env=env) as control,
    ):
        [got] = http.wait(1, timeout=60)
        assert (lease_holder(settings) or "").startswith("control@")
    assert "sends the alerts" in control.output() and "sends the alerts" not in steps.output()
    assert got.json()["id"] == key and got.signature_valid(SECRET)
    assert deliveries(settings, key)["hook"].status is DeliveryStatus.DELIVERED
    print(f"kill -> successor's delivery: {got.received_at - killed.timestamp():.3f} s")


@pytest.mark.parametrize(
    ("value", "ttl_ms", "why"),
    [
        ("x", None, "no expiry"),  # one SET by hand: alerting stopped for ever, silently
        ("celery@gone-host", None, "no expiry"),
        ("x", 5_000, "not a worker's name"),
        ("celery@other", 86_400_000, "a TTL of 86400 s"),  # longer than any sender gives
    ],
)
def test_a_lease_no_sender_could_hold_is_taken_over_and_logged(
    app: ChordbeatCelery,
    settings: Settings,
    caplog: pytest.LogCaptureFixture,
    value: str,
    ttl_ms: int | None,
    why: str,
) -> None:
    client = redis.Redis.from_url(settings.broker_url)
    client.set(sender_thread.LEASE_KEY, value, px=ttl_ms)
    thread = sender_thread.SenderThread(settings, "celery@control-a")
    try:
        assert thread.holds_lease()
    finally:
        thread.sender.close(1)
    assert lease_holder(settings) == "celery@control-a"
    assert 0 < client.pttl(sender_thread.LEASE_KEY) <= (sender_thread.LEASE_S + settings.alert_poll_interval_s) * 1000
    [warning] = [r for r in caplog.records if r.levelname == "WARNING" and "lease" in r.getMessage()]
    assert repr(value) in warning.getMessage() and why in warning.getMessage()


def test_a_live_senders_lease_is_left_to_it(app: ChordbeatCelery, settings: Settings) -> None:
    holder = sender_thread.SenderThread(settings, "celery@control-a")
    other = sender_thread.SenderThread(settings, "celery@control-b")
    try:
        assert holder.holds_lease() and not other.holds_lease() and holder.holds_lease()
    finally:
        holder.sender.close(1)
        other.sender.close(1)
    assert lease_holder(settings) == "celery@control-a"
