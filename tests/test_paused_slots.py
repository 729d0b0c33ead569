"""A paused schedule's slot record: each due time that passes while paused gets one
``skipped_paused`` row (recovery's periodic pass, and the resume for the last ones), and none of
them shows up again as missed or fired after the resume. Slot enumeration is pure (cadence)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from hypothesis import given
from hypothesis import strategies as st

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.domain.cadence import Cadence
from celeryapp.recovery.paused_slots import paused_detail
from models import Schedule
from tests.support import processes
from tests.support.helpers import call, step, ts, wait_for

pytestmark = pytest.mark.both_databases

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
#: Instants around both of 2026's DST changes in New York and London (March and October/November).
INSTANTS = st.integers(min_value=0, max_value=365 * 24 * 3600).map(lambda s: EPOCH + timedelta(seconds=s))
WINDOWS = st.integers(min_value=0, max_value=3 * 24 * 3600).map(lambda s: timedelta(seconds=s))
DST_DAYS = [
    datetime(2026, 3, 8, tzinfo=UTC),  # New York springs forward
    datetime(2026, 3, 29, tzinfo=UTC),  # London
    datetime(2026, 10, 25, tzinfo=UTC),  # London falls back
    datetime(2026, 11, 1, tzinfo=UTC),  # New York
]


def hours_between(since: datetime, until: datetime) -> list[datetime]:
    """The reference: whole UTC hours in (since, until]. Both zones' offsets are whole hours, so
    a local ``0 * * * *`` is every UTC hour, DST or not: no hour doubled, none dropped."""
    first = since.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    return [first + timedelta(hours=k) for k in range(int((until - first) / timedelta(hours=1)) + 1) if first <= until]


@pytest.mark.parametrize("zone", ["America/New_York", "Europe/London"])
@pytest.mark.parametrize("day", DST_DAYS)
def test_hourly_cron_slots_across_a_dst_change_are_every_utc_hour_once(zone: str, day: datetime) -> None:
    cadence = Cadence(cron="0 * * * *", every_s=None, timezone=zone, anchor=EPOCH)
    since, until = day - timedelta(hours=3, minutes=17), day + timedelta(hours=30)
    slots, more = cadence.slots_between(since, until, cap=100)
    assert slots == hours_between(since, until) and not more


@given(since=INSTANTS, window=WINDOWS, cap=st.integers(min_value=1, max_value=80))
def test_slots_between_is_the_first_cap_slots_of_the_window_and_says_if_more(
    since: datetime, window: timedelta, cap: int
) -> None:
    cadence = Cadence(cron="0 * * * *", every_s=None, timezone="America/New_York", anchor=EPOCH)
    reference = hours_between(since, since + window)
    slots, more = cadence.slots_between(since, since + window, cap)
    assert slots == reference[:cap] and more == (len(reference) > cap)


@given(
    anchor=INSTANTS,
    offset=st.integers(min_value=-10_000, max_value=10_000),
    every=st.integers(min_value=1, max_value=7200),
    window=st.integers(min_value=0, max_value=50_000),
    cap=st.integers(min_value=1, max_value=50),
)
def test_interval_slots_are_the_anchored_grid_inside_the_window(
    anchor: datetime, offset: int, every: int, window: int, cap: int
) -> None:
    cadence = Cadence(cron=None, every_s=float(every), timezone="UTC", anchor=anchor)
    since = anchor + timedelta(seconds=offset)
    until = since + timedelta(seconds=window)
    grid = [anchor + timedelta(seconds=every * k) for k in range(0, (offset + window) // every + 2)]
    reference = [t for t in grid if since < t <= until]
    slots, more = cadence.slots_between(since, until, cap)
    assert slots == reference[:cap] and more == (len(reference) > cap)


def test_a_cap_below_one_is_refused() -> None:
    cadence = Cadence(cron=None, every_s=1.0, timezone="UTC", anchor=EPOCH)
    with pytest.raises(ValueError, match="cap must be at least 1"):
        cadence.slots_between(EPOCH, EPOCH + timedelta(hours=1), 0)


def records(client: Celery, name: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = call(client, "chordbeat.list_slots", name=name, limit=1000)
    return list(reversed(rows))


def test_a_paused_schedule_records_each_passed_slot_while_paused_and_nothing_twice_after_resume(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    call(client, "chordbeat.apply_schedule", definition={"name": "tick", "every": 2, "steps": [step("s")]})
    with processes.beat(settings, tmp_path):
        wait_for(lambda: any(r["outcome"] == "fired" for r in records(client, "tick")), 20, what="a first run")
        paused = call(client, "chordbeat.pause_schedule", name="tick", actor="tester", reason="maintenance")
        paused_at = ts(paused["paused_at"])
        # Recorded by recovery's pass (every second here) while the schedule is still paused.
        skipped = wait_for(
            lambda: len(s := [r for r in records(client, "tick") if r["outcome"] == "skipped_paused"]) >= 3 and s,
            15,
            interval=0.2,
            what="three skipped_paused rows while paused",
        )
        assert isinstance(skipped, list)
        assert call(client, "chordbeat.get_schedule", name="tick")["status"] == "paused"
        assert {r["detail"] for r in skipped} == {"paused by tester: maintenance"}
        assert all(paused_at < ts(r["nominal_at"]) <= datetime.now(UTC) for r in skipped)
        resumed_at = ts(call(client, "chordbeat.resume_schedule", name="tick")["next_run_at"])
        wait_for(
            lambda: any(r["outcome"] == "fired" and ts(r["nominal_at"]) >= resumed_at for r in records(client, "tick")),
            20,
            what="a run after the resume",
        )
    rows = [r for r in records(client, "tick") if r["trigger"] == "interval"]
    nominal = [ts(r["nominal_at"]) for r in rows]
    assert len(nominal) == len(set(nominal)), "a slot recorded twice"
    assert "missed" not in {r["outcome"] for r in rows}
    during = sorted(t for r, t in zip(rows, nominal, strict=True) if r["outcome"] == "skipped_paused")
    # Every slot of the pause, none left out: from the first after the pause to the last before
    # the resume, two seconds apart.
    assert all(b - a == timedelta(seconds=2) for a, b in itertools.pairwise(during))
    assert during[0] - paused_at <= timedelta(seconds=2) and resumed_at - during[-1] <= timedelta(seconds=2)
    assert all(paused_at < t < resumed_at for t in during)
    assert all(t < paused_at or t >= resumed_at for r, t in zip(rows, nominal, strict=True) if r["outcome"] == "fired")


@pytest.mark.parametrize(
    ("by", "reason", "detail"),
    [
        ("tester", "maintenance", "paused by tester: maintenance"),
        ("tester", None, "paused by tester"),
        (None, "enabled: false in the definition", "paused: enabled: false in the definition"),
        (None, None, "paused"),
    ],
)
def test_a_paused_slot_says_who_and_why_as_far_as_known(by: str | None, reason: str | None, detail: str) -> None:
    assert paused_detail(Schedule(name="s", paused_by=by, paused_reason=reason)) == detail
