"""Catch-up policies at work, with a real worker and beat (on SQLite, docs/testing.md): beat frozen
(SIGSTOP) across four slots of fast schedules, then thawed 2 s past the fourth. ``latest`` runs
that slot and records the three before it missed; ``none`` runs nothing late (the thawed slot is
past the missed grace, 1 s here) and records it too; ``all`` with ``max_runs: 2`` runs it and
then the two newest missed slots, oldest first, one at a time, each with its slot, and records
the oldest as not made up. The slots on time afterwards run for all three."""

from __future__ import annotations

import dataclasses
import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import update

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.domain.times import iso
from celeryapp.worker import firing
from models import Schedule, Trigger, transaction
from tests.support import processes
from tests.support.helpers import call, step, ts, wait_for

#: Seconds between slots: beat freezes across four of them.
EVERY_S = 4
#: The missed grace the fire uses (CHORDBEAT_ALERT_MISSED_GRACE): a slot fired later does not
#: run under ``none``.
GRACE_S = 1.0
#: Beat thaws this long after a slot, so the slot it fires then is that late (more than the grace,
#: less than the next slot).
THAW_AFTER_S = 2.0


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return dataclasses.replace(settings, alert_missed_grace_s=GRACE_S)


def slots(client: Celery, name: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = call(client, "chordbeat.list_slots", name=name, limit=1000)
    # Newest first by id: reversed, records of one slot and one instant keep the order written.
    return sorted(reversed(rows), key=lambda r: (ts(r["nominal_at"]), r["recorded_at"]))


def first_fired(client: Celery, name: str) -> datetime | None:
    fired = [ts(r["nominal_at"]) for r in slots(client, name) if r["outcome"] == "fired"]
    return fired[0] if fired else None


@pytest.mark.timeout(120)
def test_latest_runs_the_slot_fired_after_beat_froze_none_nothing_late_and_all_the_newest_missed(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    policies = {
        "latest": {"policy": "latest"},
        "none": {"policy": "none"},
        "all": {"policy": "all", "window": 3600, "max_runs": 2},
    }
    for name, catchup in policies.items():
        definition = {"name": name, "every": EVERY_S, "catchup": catchup, "steps": [step("s")]}
        call(client, "chordbeat.apply_schedule", definition=definition)
    with processes.beat(settings, tmp_path) as beat:
        firsts = wait_for(
            lambda: all(f := [first_fired(client, name) for name in policies]) and f, 30, what="a first run of each"
        )
        assert isinstance(firsts, list)
        beat.signal_group(signal.SIGSTOP)
        frozen_at = datetime.now(UTC)
        try:
            # Thawed 2 s past the fourth slot after each one's first run: three slots are missed
            # and the fourth fires late.
            thaw = max(first + timedelta(seconds=4 * EVERY_S + THAW_AFTER_S) for first in firsts)
            wait_for(lambda: datetime.now(UTC) >= thaw, 30, interval=0.05, what="four slots to pass")
        finally:
            beat.signal_group(signal.SIGCONT)
        thawed_at = datetime.now(UTC)
        wait_for(
            lambda: all(
                any(r["outcome"] == "fired" and ts(r["nominal_at"]) > thawed_at for r in slots(client, name))
                for name in policies
            ),
            30,
            what="a slot after the thaw run by each",
        )
    latest, none = slots(client, "latest"), slots(client, "none")
    frozen = [r for r in latest if frozen_at < ts(r["nominal_at"]) < thawed_at - timedelta(seconds=EVERY_S)]
    assert len(frozen) >= 3 and {r["outcome"] for r in frozen} == {"missed"}, frozen
    assert all(r["detail"].endswith("; no make-up run") for r in frozen)
    # latest: the slot beat fired on thawing ran, late.
    late = [r for r in latest if r["outcome"] == "fired" and frozen_at < ts(r["nominal_at"]) < thawed_at]
    assert len(late) == 1 and ts(late[0]["recorded_at"]) - ts(late[0]["nominal_at"]) > timedelta(seconds=GRACE_S)
    # none: nothing ran late; the slot beat fired on thawing is recorded missed, saying why.
    for record in none:
        if record["outcome"] == "fired":
            assert ts(record["recorded_at"]) - ts(record["nominal_at"]) <= timedelta(seconds=GRACE_S), record
    during = [r for r in none if frozen_at < ts(r["nominal_at"]) < thawed_at]
    assert len(during) >= 4 and {r["outcome"] for r in during} == {"missed"}, during
    too_late = [r for r in during if r["detail"].endswith("late; catchup: none")]
    assert len(too_late) == 1 and too_late[0]["detail"].startswith("not run: fired "), during
    assert ts(too_late[0]["nominal_at"]) == max(ts(r["nominal_at"]) for r in during)
    assert not any(
        frozen_at < ts(e["started_at"]) and ts(e["started_at"]) < thawed_at + timedelta(seconds=GRACE_S)
        for e in call(client, "chordbeat.list_executions", schedule="none")
    )
    # all: the slot fired on thawing ran first, then the two newest missed ones, oldest first, one
    # at a time, each with its own slot; the oldest missed one says why it was not made up.
    made_up = wait_for(lambda: made_up_runs(client, frozen_at, thawed_at), 30, what="two made-up runs to end")
    assert isinstance(made_up, list)
    records = slots(client, "all")
    missed = [r for r in records if r["outcome"] == "missed" and frozen_at < ts(r["nominal_at"]) < thawed_at]
    assert [ts(r["nominal_at"]) for r in missed[-2:]] == [ts(e["slot"]) for e in made_up]
    number = made_up_number(missed[-1]["detail"])
    assert [r["detail"] for r in missed[-2:]] == [f"missed; made up by catch-up #{number}"] * 2
    assert all(r["detail"].endswith("not made up: older than the newest 2 (catchup.max_runs)") for r in missed[:-2])
    assert len(missed) >= 3
    fired = [r for r in records if r["outcome"] == "fired" and r["detail"] == f"catch-up #{number}"]
    assert [r["nominal_at"] for r in fired] == [r["nominal_at"] for r in missed[-2:]]
    first, second = made_up
    assert first["trigger"] == second["trigger"] == "interval"
    assert ts(first["completed_at"]) <= ts(second["started_at"]), "one at a time"
    regular = [
        e
        for e in call(client, "chordbeat.list_executions", schedule="all")
        if frozen_at < ts(e["slot"]) < thawed_at and e["id"] not in {first["id"], second["id"]}
    ]
    assert len(regular) == 1 and ts(regular[0]["started_at"]) <= ts(first["started_at"]), regular


def made_up_runs(client: Celery, frozen_at: datetime, thawed_at: datetime) -> list[dict[str, Any]] | None:
    """The two runs of missed slots (before the one beat fired on thawing), once both ended."""
    runs = [
        execution
        for execution in call(client, "chordbeat.list_executions", schedule="all")
        if execution["slot"] is not None and frozen_at < ts(execution["slot"]) < thawed_at - timedelta(seconds=EVERY_S)
    ]
    if len(runs) < 2 or any(e["status"] == "in_progress" for e in runs):
        return None
    return sorted(runs, key=lambda e: ts(e["slot"]))


def made_up_number(detail: str) -> int:
    assert detail.startswith("missed; made up by catch-up #"), detail
    return int(detail.rsplit("#", 1)[1])


def test_apply_stores_the_catchup_gives_it_back_and_refuses_a_bad_one_naming_every_field(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    definition = {"name": "reports", "cron": "0 6 * * *", "steps": [step("s")]}
    created = call(client, "chordbeat.apply_schedule", definition={**definition, "catchup": {"policy": "all"}})
    assert created["catchup"] == {"policy": "all", "window": 86400, "max_runs": 10}
    assert call(client, "chordbeat.get_schedule", name="reports")["catchup"] == created["catchup"]
    # What the object shows applies unchanged.
    assert call(client, "chordbeat.apply_schedule", definition={**definition, "catchup": created["catchup"]}) == created
    bad = {"policy": "none", "window": float("nan"), "max_runs": True, "every": 1}
    with pytest.raises(Exception) as refused:
        call(client, "chordbeat.apply_schedule", definition={**definition, "catchup": bad})
    for field in ("catchup.window", "catchup.max_runs", "catchup.every"):
        assert field in str(refused.value)
    assert call(client, "chordbeat.get_schedule", name="reports")["catchup"] == created["catchup"]
    assert call(client, "chordbeat.apply_schedule", definition=definition)["catchup"] is None


def _last_6_pm(now: datetime) -> datetime:
    """The latest 18:00 UTC at or before ``now``: the daily schedules' latest slot."""
    latest = now.replace(hour=18, minute=0, second=0, microsecond=0)
    return latest - timedelta(days=1) if latest > now else latest


def _apply_daily(client: Celery, one_step: dict[str, Any]) -> None:
    """A schedule "daily" at 18:00 UTC that makes up to 5 missed slots of the last 5 days."""
    catchup = {"policy": "all", "window": 5 * 86400, "max_runs": 5}
    definition = {"name": "daily", "cron": "0 18 * * *", "catchup": catchup, "steps": [one_step]}
    call(client, "chordbeat.apply_schedule", definition=definition)


def test_all_after_days_down_makes_up_the_slots_in_its_window_except_an_excluded_day(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    now = datetime.now(UTC)
    latest = _last_6_pm(now)
    day = {n: latest - timedelta(days=n) for n in range(1, 6)}
    # Back to three days before the slot fired, and an hour more: four days back is outside.
    window_s = int((now - day[3]).total_seconds()) + 3600
    catchup = {"policy": "all", "window": window_s, "max_runs": 5}
    calendar = {"exclude": [day[2].date().isoformat()]}
    definition = {"name": "daily", "cron": "0 18 * * *", "catchup": catchup, "calendar": calendar}
    call(client, "chordbeat.apply_schedule", definition={**definition, "steps": [step("s")]})
    # Beat was down for five days: the slot fired now is the first since the one six days ago.
    with transaction(app.settings.database_url) as session:
        session.execute(update(Schedule).values(last_slot_at=latest - timedelta(days=6)))
    answer = firing.fire(app, "daily", nominal_at=latest, trigger=Trigger.CRON)
    assert answer["status"] == "in_progress", answer

    def ended() -> list[dict[str, Any]] | None:
        runs = call(client, "chordbeat.list_executions", schedule="daily")
        return runs if len(runs) == 3 and all(r["status"] == "completed" for r in runs) else None

    runs = wait_for(ended, 30, what="the run and two made-up runs to end")
    assert isinstance(runs, list)
    assert sorted(ts(r["slot"]) for r in runs) == [day[3], day[1], latest]
    records = {(ts(r["nominal_at"]), r["outcome"]): r["detail"] for r in slots(client, "daily")}
    window_words = "not made up: older than catchup.window"
    assert window_words in records[day[5], "missed"] and window_words in records[day[4], "missed"]
    assert records[day[2], "skipped_calendar"] == "not run: excluded by the schedule's calendar.exclude"
    number = made_up_number(records[day[3], "missed"])
    assert records[day[1], "missed"] == records[day[3], "missed"]
    assert records[day[3], "fired"] == records[day[1], "fired"] == f"catch-up #{number}"
    assert (latest, "fired") in records


def test_all_makes_up_a_slot_whose_fire_came_after_the_next_was_due(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    latest = _last_6_pm(datetime.now(UTC))
    day = {n: latest - timedelta(days=n) for n in range(1, 4)}
    _apply_daily(client, step("s"))
    # The workers were down: yesterday's fire message is taken only now, once today's slot is due.
    with transaction(app.settings.database_url) as session:
        session.execute(update(Schedule).values(last_slot_at=day[3]))
    answer = firing.fire(app, "daily", nominal_at=day[1], trigger=Trigger.CRON)
    assert answer["skipped"].startswith("superseded"), answer

    def ended() -> list[dict[str, Any]] | None:
        runs = call(client, "chordbeat.list_executions", schedule="daily")
        return runs if len(runs) == 2 and all(r["status"] == "completed" for r in runs) else None

    runs = wait_for(ended, 30, what="two made-up runs to end")
    assert isinstance(runs, list)
    assert sorted(ts(r["slot"]) for r in runs) == [day[2], day[1]]
    assert {r["trigger"] for r in runs} == {"cron"}
    records = [(ts(r["nominal_at"]), r["outcome"], r["detail"]) for r in slots(client, "daily")]
    number = made_up_number(records[0][2])
    assert records == [
        (day[2], "missed", f"missed; made up by catch-up #{number}"),
        (day[2], "fired", f"catch-up #{number}"),
        (day[1], "skipped_superseded", f"superseded; made up by catch-up #{number}"),
        (day[1], "fired", f"catch-up #{number}"),
    ]


def test_a_superseded_slot_is_not_made_up_while_a_catch_up_of_the_schedule_runs(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    latest = _last_6_pm(datetime.now(UTC))
    day = {n: latest - timedelta(days=n) for n in range(1, 4)}
    _apply_daily(client, step("s", kwargs={"seconds": 3}))
    with transaction(app.settings.database_url) as session:
        session.execute(update(Schedule).values(last_slot_at=day[3]))
    # A backlog of fire messages taken one after the other: the first makes its slot up, the
    # second comes while that make-up run is still going.
    assert firing.fire(app, "daily", nominal_at=day[2], trigger=Trigger.CRON)["skipped"].startswith("superseded")
    assert firing.fire(app, "daily", nominal_at=day[1], trigger=Trigger.CRON)["skipped"].startswith("superseded")
    runs = call(client, "chordbeat.list_executions", schedule="daily")
    assert [(ts(r["slot"]), r["status"]) for r in runs] == [(day[2], "in_progress")]
    records = [(ts(r["nominal_at"]), r["outcome"], r["detail"]) for r in slots(client, "daily")]
    number = made_up_number(records[0][2].replace("superseded;", "missed;"))
    assert records == [
        (day[2], "skipped_superseded", f"superseded; made up by catch-up #{number}"),
        (day[2], "fired", f"catch-up #{number}"),
        (day[1], "skipped_superseded", f"superseded: the slot at {iso(latest)} is already due"),
    ]


def test_all_makes_up_no_slot_missed_while_paused(app: ChordbeatCelery, worker: Any, client: Celery) -> None:
    latest = _last_6_pm(datetime.now(UTC))
    _apply_daily(client, step("s"))
    with transaction(app.settings.database_url) as session:
        session.execute(update(Schedule).values(last_slot_at=latest - timedelta(days=3)))
    # Paused and resumed since (the slots between were the pause's, recorded skipped_paused).
    call(client, "chordbeat.pause_schedule", name="daily")
    call(client, "chordbeat.resume_schedule", name="daily")
    assert firing.fire(app, "daily", nominal_at=latest, trigger=Trigger.CRON)["status"] == "in_progress"
    runs = call(client, "chordbeat.list_executions", schedule="daily")
    assert [ts(r["slot"]) for r in runs] == [latest]
    assert call(client, "chordbeat.list_backfills", name="daily") == []
    assert not [r for r in slots(client, "daily") if "made up" in (r["detail"] or "")]
