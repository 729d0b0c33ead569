"""Business calendars at work, with a real worker and beat: a slot on an excluded day is recorded
``skipped_calendar`` with the reason and starts nothing, a calendar file that breaks stops the
runs (never a silent run), and the next-fires preview (``chordbeat.next_fires``, ``chordbeat next``
in a terminal 80 columns wide) marks the excluded slots with the reason."""

from __future__ import annotations

import dataclasses
import json
import sys
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from sqlalchemy import update

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.worker import firing
from models import Schedule, Trigger, transaction
from tests.support import processes
from tests.support.helpers import call, step, ts, wait_for
from tests.support.terminals import in_pty, plain_lines

CHORDBEAT = str(Path(sys.executable).with_name("chordbeat"))
INLINE = "excluded by the schedule's calendar.exclude"


@pytest.fixture
def calendars_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "calendars"
    directory.mkdir()
    return directory


@pytest.fixture
def settings(settings: Settings, calendars_dir: Path) -> Settings:
    return dataclasses.replace(settings, calendars_dir=str(calendars_dir))


def days_around_now() -> list[str]:
    """Today and tomorrow in UTC: a slot fired during the test falls on one of them."""
    today = datetime.now(UTC).date()
    return [today.isoformat(), (today + timedelta(days=1)).isoformat()]


def slots(client: Celery, name: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = call(client, "chordbeat.list_slots", name=name, limit=1000)
    return [r for r in rows if r["trigger"] == "interval"]


def outcomes(client: Celery, name: str, outcome: str) -> list[dict[str, Any]]:
    return [r for r in slots(client, name) if r["outcome"] == outcome]


def test_an_excluded_slot_is_recorded_skipped_calendar_and_starts_nothing(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings, tmp_path: Path, calendars_dir: Path
) -> None:
    (calendars_dir / "shutdown").write_text("# the plant is closed\n" + "\n".join(days_around_now()) + "\n")
    for name, calendar in [
        ("open", None),
        ("closed", {"exclude": days_around_now()}),
        ("holiday", {"calendars": ["shutdown"], "on_excluded": "skip"}),
    ]:
        definition = {"name": name, "every": 2, "steps": [step("s")], "calendar": calendar}
        call(client, "chordbeat.apply_schedule", definition=definition)
    with processes.beat(settings, tmp_path):
        wait_for(lambda: len(outcomes(client, "open", "fired")) >= 2, 30, what="two runs of the open schedule")
        for name in ("closed", "holiday"):
            wait_for(lambda n=name: len(outcomes(client, n, "skipped_calendar")) >= 2, 30, what=f"{name} skipped")
        # The calendar file breaks: the slots still start nothing, and say why.
        (calendars_dir / "shutdown").write_text("2026-02-30\n")
        wait_for(
            lambda: any(
                "cannot be read" in (r["detail"] or "") for r in outcomes(client, "holiday", "skipped_calendar")
            ),
            30,
            what="a slot skipped because the calendar cannot be read",
        )
    assert call(client, "chordbeat.list_executions", schedule="closed") == []
    assert call(client, "chordbeat.list_executions", schedule="holiday") == []
    assert {r["outcome"] for r in slots(client, "closed")} == {"skipped_calendar"}
    assert {r["detail"] for r in slots(client, "closed")} == {f"not run: {INLINE}"}
    details = {r["detail"] for r in slots(client, "holiday")}
    broken = f"not run: its calendar cannot be read: {calendars_dir / 'shutdown'}: line 1 is not a date"
    assert "not run: in calendar 'shutdown'" in details
    assert all(d == "not run: in calendar 'shutdown'" or d.startswith(broken) for d in details), details
    assert all(r["execution_id"] is None for r in slots(client, "holiday"))
    # The schedule stays active and counts no run; the open one ran meanwhile.
    closed = call(client, "chordbeat.get_schedule", name="closed")
    assert (closed["status"], closed["run_count"], closed["error_count"]) == ("active", 0, 0)
    assert call(client, "chordbeat.list_executions", schedule="open")


def upcoming_days(count: int) -> list[date]:
    """The London dates of the next ``count`` 18:00 London slots."""
    zone = ZoneInfo("Europe/London")
    now = datetime.now(zone)
    first = now.date() if now.hour < 18 else now.date() + timedelta(days=1)
    return [first + timedelta(days=n) for n in range(count)]


def test_the_preview_marks_excluded_slots_with_the_reason(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings, calendars_dir: Path
) -> None:
    days = upcoming_days(10)
    (calendars_dir / "uk").write_text(f"# bank holidays\n{days[4].isoformat()}\n")
    definition = {
        "name": "payroll",
        "cron": "0 18 * * *",
        "timezone": "Europe/London",
        "steps": [step("pay")],
        "calendar": {"exclude": [days[2].isoformat()], "calendars": ["uk"]},
    }
    call(client, "chordbeat.apply_schedule", definition=definition)
    fires = call(client, "chordbeat.next_fires", name="payroll", count=6)
    assert [datetime.fromisoformat(f["local"]).date() for f in fires] == days[:6]
    assert all(f["local"][10:19] == "T18:00:00" and f["at"].endswith(":00.000Z") for f in fires), fires
    assert [f["excluded"] for f in fires] == [None, None, INLINE, None, "in calendar 'uk'", None]
    assert len(call(client, "chordbeat.next_fires", name="payroll")) == 10
    assert len(call(client, "chordbeat.next_fires", name="payroll", count=100)) == 100
    for bad in (0, 101, True, "5", 2.5):
        with pytest.raises(Exception, match="count: must be an integer between 1 and 100"):
            call(client, "chordbeat.next_fires", name="payroll", count=bad)
    with pytest.raises(Exception, match="does not exist"):
        call(client, "chordbeat.next_fires", name="nope")
    # As a person sees it: each slot on its own line, the excluded ones saying why.
    status, output = in_pty([CHORDBEAT, "next", "payroll", "-n", "6"], processes.settings_env(settings), columns=80)
    assert status == 0, output
    text = " ".join(" ".join(plain_lines(output)).split())
    assert text.count("not run:") == 2, output
    assert f"not run: {INLINE}" in text and "not run: in calendar 'uk'" in text
    # chordbeat show's next runs (three: the third is excluded) and next --json say the same.
    status, output = in_pty([CHORDBEAT, "show", "payroll"], processes.settings_env(settings), columns=80)
    assert status == 0, output
    lines = [line.rstrip() for line in plain_lines(output)]
    start = lines.index("next runs") + 1
    runs = " ".join(" ".join(lines[start : lines.index("recent executions", start)]).split())
    assert runs.count("not run:") == 1 and runs.endswith(f"not run: {INLINE}"), output
    assert all(len(line) <= 80 for line in lines), output
    status, output = in_pty(
        [CHORDBEAT, "next", "payroll", "-n", "6", "--json"], processes.settings_env(settings), columns=80
    )
    assert status == 0, output
    shown = json.loads(output)
    assert [f["excluded"] for f in shown] == [None, None, INLINE, None, "in calendar 'uk'", None], output
    assert [(f["at"], f["local"]) for f in shown] == [(f["at"], f["local"]) for f in fires]
    # Past the preview's bound no exclusion is known: refused, not shown as running.
    status, output = in_pty([CHORDBEAT, "next", "payroll", "-n", "101"], processes.settings_env(settings), columns=80)
    assert status == 2 and "at most 100 for a schedule with a business calendar" in output, output
    # A calendar that breaks is said on every slot: none of them will run.
    (calendars_dir / "uk").write_text("2026-13-01\n")
    broken = call(client, "chordbeat.next_fires", name="payroll", count=3)
    assert all(f["excluded"].startswith("its calendar cannot be read: ") for f in broken)
    # A schedule without a calendar: nothing excluded.
    call(client, "chordbeat.apply_schedule", definition={**definition, "calendar": None})
    assert [f["excluded"] for f in call(client, "chordbeat.next_fires", name="payroll", count=3)] == [None] * 3


def test_slots_never_fired_on_excluded_days_are_recorded_skipped_calendar_not_missed(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    now = datetime.now(UTC)
    latest = now.replace(hour=18, minute=0, second=0, microsecond=0)
    latest -= timedelta(days=1) if latest > now else timedelta(0)
    days = [(latest - timedelta(days=n)).date() for n in (3, 2, 1)]
    definition = {"name": "daily", "cron": "0 18 * * *", "steps": [step("s")]}
    call(client, "chordbeat.apply_schedule", definition={**definition, "calendar": {"exclude": [days[1].isoformat()]}})
    # Beat was down for three days: the slot fired now is the first since the one 4 days ago.
    with transaction(app.settings.database_url) as session:
        session.execute(update(Schedule).values(last_slot_at=latest - timedelta(days=4)))
    answer = firing.fire(app, "daily", nominal_at=latest, trigger=Trigger.CRON)
    assert answer["status"] == "in_progress", answer
    rows = {ts(r["nominal_at"]).date(): (r["outcome"], r["detail"]) for r in slots_of(client, "daily")}
    assert rows[days[0]][0] == rows[days[2]][0] == "missed"
    assert rows[days[1]] == ("skipped_calendar", f"not run: {INLINE}")
    assert rows[latest.date()][0] == "fired"


def slots_of(client: Celery, name: str) -> list[dict[str, Any]]:
    return [r for r in call(client, "chordbeat.list_slots", name=name, limit=100) if r["trigger"] == "cron"]
