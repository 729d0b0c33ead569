"""Nominal slots, no make-up runs and retries replacing the cadence, with computed times."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from celeryapp.domain.cadence import Cadence, Due, next_due

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


def every(seconds: float) -> Cadence:
    return Cadence(cron=None, every_s=seconds, timezone="UTC", anchor=T0)


def test_interval_slots_are_anchored_and_never_drift() -> None:
    cadence = every(60)
    assert cadence.slot_after(T0) == T0 + timedelta(seconds=60)
    # Fired late (at +61.7 s): the next slot is still +120 s, not +121.7 s.
    assert cadence.slot_after(T0 + timedelta(seconds=61.7)) == T0 + timedelta(seconds=120)


def test_after_downtime_only_the_latest_missed_slot_runs() -> None:
    cadence = every(7200)  # every 2 h; a 12 h outage misses 6 slots
    last_fired = T0
    now = T0 + timedelta(hours=12, minutes=5)
    assert cadence.latest_slot(now, since=last_fired) == T0 + timedelta(hours=12)
    # Once that slot has fired, nothing else is due until the regular cadence.
    assert cadence.slot_after(now) == T0 + timedelta(hours=14)
    assert cadence.latest_slot(now, since=T0 + timedelta(hours=12)) is None


def test_cron_downtime_runs_once_for_the_latest_slot() -> None:
    cadence = Cadence(cron="0 2 * * *", every_s=None, timezone="Europe/London", anchor=T0)
    last_fired = datetime(2026, 11, 1, 2, 0, tzinfo=UTC)
    now = datetime(2026, 11, 21, 9, 0, tzinfo=UTC)
    assert cadence.latest_slot(now, since=last_fired) == datetime(2026, 11, 21, 2, 0, tzinfo=UTC)
    assert cadence.slot_after(now) == datetime(2026, 11, 22, 2, 0, tzinfo=UTC)


def test_a_very_frequent_schedule_after_a_long_outage_still_finds_its_latest_slot() -> None:
    cadence = Cadence(cron="* * * * *", every_s=None, timezone="UTC", anchor=T0)
    now = T0 + timedelta(days=30, seconds=30)
    assert cadence.latest_slot(now, since=T0) == T0 + timedelta(days=30)


def test_a_pending_retry_replaces_the_cadence_until_it_has_fired() -> None:
    cadence = every(3600)
    retry_at = T0 + timedelta(seconds=90)
    assert next_due(cadence, last_fired=T0, retry_at=retry_at) == Due(retry_at, retry=True)
    # Fired: back to the regular slots.
    assert next_due(cadence, last_fired=retry_at, retry_at=retry_at) == Due(T0 + timedelta(hours=1), retry=False)
    assert next_due(cadence, last_fired=T0, retry_at=None) == Due(T0 + timedelta(hours=1), retry=False)
