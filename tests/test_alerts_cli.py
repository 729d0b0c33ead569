"""``chordbeat alerts`` as a person at an 80-column terminal uses it: the list in the one time
format, acknowledging, silencing after a question, ending a silence, and a test alert whose
delivery the command waits for."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from sqlalchemy import select, update

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.domain.times import iso
from celeryapp.monitoring.alert_outbox import raise_alert
from models import AlertKind, AuditEvent, Schedule, transaction, utcnow
from tests.support import processes
from tests.support.helpers import call, finished, step
from tests.support.receivers import HttpReceiver, http_receiver  # noqa: F401  (a fixture)
from tests.support.terminals import STYLE, in_pty, plain_lines, time_format_problems, wide_lines

CHORDBEAT = str(Path(sys.executable).with_name("chordbeat"))
CHANNELS_FILE = """\
channels:
  ops-webhook: {kind: webhook, url_env: OPS_WEBHOOK_URL, insecure: true}
  broken-hook: {kind: webhook, url_env: BROKEN_WEBHOOK_URL, insecure: true}
"""
NAME = "nightly-hr-sync"
VIEWER = {"TZ": "Asia/Kolkata", "CHORDBEAT_ACTOR": "alice"}


@pytest.fixture
def settings(settings: Settings, tmp_path: Path) -> Settings:
    path = tmp_path / "channels.yaml"
    path.write_text(CHANNELS_FILE)
    return dataclasses.replace(settings, alert_channels_file=str(path))


def chordbeat(settings: Settings, *args: str, replies: dict[str, str] | None = None) -> tuple[int, list[str]]:
    """The real ``chordbeat`` in an 80-column terminal in India: exit status and the lines seen."""
    env = processes.settings_env(settings, TERM="xterm-256color", **VIEWER)
    status, output = in_pty([CHORDBEAT, *args], env, columns=80, replies=replies)
    return status, plain_lines(STYLE.sub("", output))


def readable(lines: list[str]) -> list[str]:
    """What must read as people's times: all but the alert ids, which are the stable keys a
    receiver de-duplicates on (``missed/x/2026-11-24T02:00:00.000Z``), copied, not read."""
    return [line for line in lines if not line.startswith("  id ")]


@pytest.fixture
def raised(app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings) -> dict[str, str]:
    """A London schedule paging ops-webhook: one failed run's alert and a missed slot's."""
    definition = {
        "name": NAME,
        "cron": "0 2 * * *",
        "timezone": "Europe/London",
        "steps": [step("HR System - Full Import", "chordbeat.examples.fail", kwargs={"message": "LDAP said no"})],
    }
    call(client, "chordbeat.apply_schedule", definition=definition)
    with transaction(settings.database_url) as session:
        config = {"channels": ["ops-webhook"], "on": ["failed", "missed"]}
        session.execute(update(Schedule).where(Schedule.name == NAME).values(alerts=config))
    run = call(client, "chordbeat.trigger_schedule", name=NAME)["execution_id"]
    assert finished(client, run)["status"] == "failed"
    slot = (
        (utcnow() - timedelta(days=1))
        .astimezone(ZoneInfo("Europe/London"))
        .replace(hour=2, minute=0, second=0, microsecond=0)
    )
    with transaction(settings.database_url) as session:
        message = f"{NAME}: the slot of {iso(slot, timespec='seconds')} produced no run (missed)"
        raise_alert(session, schedule_name=NAME, kind=AlertKind.MISSED, message=message, now=utcnow(), slot_at=slot)
    [missed, failed] = call(client, "chordbeat.list_alerts")
    return {"failed": failed["id"], "missed": missed["id"]}


def test_alerts_lists_them_in_80_columns_in_people_s_times_and_ack_takes_an_id(
    raised: dict[str, str], client: Celery, settings: Settings
) -> None:
    status, lines = chordbeat(settings, "alerts")
    assert status == 0, lines
    text = "\n".join(lines)
    assert not wide_lines(lines), text
    assert not time_format_problems(readable(lines)), (time_format_problems(readable(lines)), text)
    assert f"missed {NAME}: open" in text and re.search(rf"failed {NAME}, run \d+: open", text), text
    # The slot's ISO instant in the message is London's wall time, India's beside it.
    assert re.search(r"slot of 20\d\d-\d\d-\d\d 02:00:00 \+0[01]:00 (GMT|BST) produced", text), text
    assert "LDAP said no" in text and "  ops-webhook: " in text, text
    assert "IST here" in text, text  # the schedule's zone, the viewer's beside it
    for alert_id in raised.values():
        assert f"  id {alert_id}" in lines, text

    status, lines = chordbeat(settings, "alerts", "ack", raised["failed"], "--reason", "rerunning after LDAP fix")
    assert status == 0 and f"{raised['failed']}: acknowledged" in lines, lines
    status, lines = chordbeat(settings, "alerts", "ack", raised["failed"], "--as", "bob")
    assert status == 0 and f"{raised['failed']}: already acknowledged by alice" in lines, lines
    status, lines = chordbeat(settings, "alerts")
    assert re.search(rf"failed {NAME}, run \d+: acknowledged by alice (now|\d+ s ago)", "\n".join(lines)), lines
    status, lines = chordbeat(settings, "alerts", "--status", "open")
    assert status == 0 and [line for line in lines if line.startswith("  id ")] == [f"  id {raised['missed']}"]
    status, lines = chordbeat(settings, "alerts", "ack", "failed/nobody/x")
    assert status == 1 and "Error: alert 'failed/nobody/x' does not exist" in lines, lines

    rows = json.loads(as_json(settings, "alerts", "--json", "--schedule", NAME))
    assert [r["id"] for r in rows] == [raised["missed"], raised["failed"]]
    with transaction(settings.database_url) as session:
        ack = session.scalars(select(AuditEvent).where(AuditEvent.action == "alert_acknowledged")).first()
        assert ack is not None
        assert (ack.actor, ack.source.value, ack.reason) == ("alice", "service", "rerunning after LDAP fix")


def as_json(settings: Settings, *args: str) -> str:
    """What a script reads from a pipe."""
    env = processes.settings_env(settings, **VIEWER)
    return subprocess.run([CHORDBEAT, *args], env=env, capture_output=True, text=True, check=True).stdout


@pytest.mark.timeout(120)
def test_silence_asks_first_then_holds_the_schedule_s_alerts_until_unsilenced(
    raised: dict[str, str], client: Celery, settings: Settings
) -> None:
    asked = {"[y/N]": "n\n"}
    status, lines = chordbeat(
        settings, "alerts", "silence", NAME, "--until", "2h", "--reason", "LDAP upgrade", replies=asked
    )
    text = "\n".join(lines)
    assert status == 1 and f"silence {NAME}'s alerts until " in text and "nothing changed" in text, text
    assert not time_format_problems(lines), (time_format_problems(lines), text)
    assert call(client, "chordbeat.list_alerts", status="silenced") == []

    status, lines = chordbeat(
        settings, "alerts", "silence", NAME, "--until", "2h", "--reason", "LDAP upgrade", replies={"[y/N]": "y\n"}
    )
    text = "\n".join(lines)
    assert status == 0 and re.search(
        rf"{NAME}: silenced until 20\d\d-\d\d-\d\d \d\d:\d\d:\d\d \+05:30 IST, in 1 h 59 min", text
    ), text
    run = call(client, "chordbeat.trigger_schedule", name=NAME)["execution_id"]
    assert finished(client, run)["status"] == "failed"
    status, lines = chordbeat(settings, "alerts", "--status", "silenced")
    assert status == 0 and re.search(rf"failed {NAME}, run {run}: silenced \(not sent\)", "\n".join(lines)), lines

    # What a person may mistype is refused, naming the option or the field; nothing changes.
    for until, said in (
        ("tomorrow", "Invalid value for --until: 'tomorrow' is neither a length"),
        ("2001-01-01 06:00", "Error: until: must be in the future"),
        ("400d", "Error: until: must be within 366 days"),
    ):
        status, lines = chordbeat(settings, "alerts", "silence", NAME, "--until", until, "--reason", "x", "--yes")
        assert status in (1, 2) and any(said in line for line in lines), (until, lines)
    status, lines = chordbeat(settings, "alerts", "silence", NAME, "--until", "1h", "--yes")
    assert status == 2 and any("Missing option '--reason'" in line for line in lines), lines

    status, lines = chordbeat(settings, "alerts", "unsilence", NAME, "--reason", "upgrade done")
    assert status == 0 and f"{NAME}: alerts are sent again" in lines, lines
    status, lines = chordbeat(settings, "alerts", "unsilence", NAME)
    assert status == 0 and f"{NAME}: was not silenced" in lines, lines
    with transaction(settings.database_url) as session:
        rows = session.scalars(select(AuditEvent).where(AuditEvent.action.in_(["silenced", "unsilenced"]))).all()
        assert [(r.action.value, r.actor, r.source.value, r.reason) for r in rows] == [
            ("silenced", "alice", "service", "LDAP upgrade"),
            ("unsilenced", "alice", "service", "upgrade done"),
            ("unsilenced", "alice", "service", None),
        ]


def test_alerts_test_gives_up_waiting_for_a_receiver_that_hangs(
    app: ChordbeatCelery,
    worker: Any,
    settings: Settings,
    http_receiver: HttpReceiver,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPS_WEBHOOK_URL", http_receiver.url)
    http_receiver.hang = True
    # A receiver that never answers: the command says so after its wait instead of hanging too.
    status, lines = chordbeat(settings, "alerts", "test", "ops-webhook", "--wait", "2")
    assert status == 1 and any("ops-webhook: no outcome within 2 s" in line for line in lines), lines


def test_alerts_test_says_delivered_or_failed_with_the_error(
    app: ChordbeatCelery,
    worker: Any,
    settings: Settings,
    http_receiver: HttpReceiver,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPS_WEBHOOK_URL", http_receiver.url)
    status, lines = chordbeat(settings, "alerts", "test", "ops-webhook", "--reason", "new pager")
    text = "\n".join(lines)
    assert status == 0 and re.search(
        r"ops-webhook: delivered 20\d\d-\d\d-\d\d .* \+05:30 IST, (now|\d+ s ago)", text
    ), text
    [request] = http_receiver.answered(200)
    body = request.json()
    assert body["kind"] == "test" and "new pager" in body["message"] and body["id"] in text

    monkeypatch.setenv("BROKEN_WEBHOOK_URL", http_receiver.url)
    http_receiver.fail_next = 100
    status, lines = chordbeat(settings, "alerts", "test", "broken-hook")
    text = "\n".join(lines)
    assert status == 1 and "broken-hook: failed (the sender retries it): " in text and "500" in text, text
    status, lines = chordbeat(settings, "alerts", "test", "pager")
    assert status == 1 and any("Error: channel: no channel 'pager' in " in line for line in lines), lines


def test_a_predicted_late_alert_says_when_the_run_is_expected_to_finish(
    raised: dict[str, str], client: Celery, settings: Settings
) -> None:
    with transaction(settings.database_url) as session:
        session.execute(
            update(Schedule).where(Schedule.name == NAME).values(alerts={"channels": ["ops-webhook"], "on": ["late"]})
        )
        now = utcnow().replace(microsecond=0)
        raise_alert(
            session,
            schedule_name=NAME,
            kind=AlertKind.LATE,
            detail="predicted",
            message=f"{NAME}: the run is expected to end after its finish deadline",
            now=now,
            slot_at=now - timedelta(hours=1),
            expected_at=now + timedelta(hours=2),
        )
    status, lines = chordbeat(settings, "alerts", "--limit", "1")
    text = "\n".join(lines)
    assert status == 0 and not wide_lines(lines), text
    assert not time_format_problems(readable(lines)), (time_format_problems(readable(lines)), text)
    assert f"late (predicted) {NAME}: open" in text, text
    assert re.search(r"expected to finish 20\d\d-\d\d-\d\d \d\d:\d\d:\d\d \+0[01]:00 (GMT|BST),", text), text
    # "in 1 h 59 min" may wrap inside (the line is 82 columns when India's date is the schedule's).
    assert re.search(r"IST here,\s+in (1 h\s+59\s+min|2 h)", text), text


@pytest.mark.timeout(120)
def test_show_says_a_schedule_s_deadlines_alerts_silence_and_open_alerts(
    raised: dict[str, str], client: Celery, settings: Settings
) -> None:
    deadlines = {"start_within": 900, "finish_within": 3600, "finish_by": "06:00"}
    pages = {"channels": ["ops-webhook", "broken-hook"], "on": ["failed", "late"]}
    with transaction(settings.database_url) as session:
        session.execute(update(Schedule).where(Schedule.name == NAME).values(deadlines=deadlines, alerts=pages))
    until = iso(utcnow() + timedelta(hours=4))
    call(client, "chordbeat.silence_schedule", name=NAME, until=until, reason="LDAP upgrade tonight", actor="bob")

    status, lines = chordbeat(settings, "show", NAME)
    text = "\n".join(lines)
    assert status == 0 and not wide_lines(lines), text
    # finish_by and the cadence's words ("at 02:00 every day") are daily wall times of the schedule's
    # zone, not instants: the one time format's date and offset do not apply to them (the viewer's
    # time of the next finish_by is beside it). Every other time must be in the format.
    timed = [re.sub(r"(?<![\d:])06:00(?![\d:])", "", line) for line in lines if not re.match(r"  at \d", line)]
    assert not time_format_problems(timed), (time_format_problems(timed), text)
    said = " ".join(line.strip() for line in lines)  # a long line may wrap
    assert re.search(
        r"deadlines: start within 15 min, finish within 1 h, finish by 06:00 Europe/London \((11:30|10:30) IST here\)",
        said,
    ), text
    assert "alerts: failed, late → ops-webhook, broken-hook" in said, text
    assert re.search(
        r"alerts silenced by bob until 20\d\d-\d\d-\d\d \d\d:\d\d:\d\d \+0[01]:00 (GMT|BST), "
        r"(20\d\d-\d\d-\d\d )?\d\d:\d\d IST here, in 3 h 59 min: LDAP upgrade tonight",
        said,
    ), text
    assert f"2 open alerts: chordbeat alerts --schedule {NAME} --status open" in said, text

    call(client, "chordbeat.unsilence_schedule", name=NAME)
    call(client, "chordbeat.acknowledge_alert", id=raised["failed"], actor="bob")
    status, lines = chordbeat(settings, "show", NAME)
    said = " ".join(line.strip() for line in lines)
    assert status == 0 and "1 open alert: " in said and "silenced" not in said, lines
    shown = json.loads(as_json(settings, "show", NAME, "--json"))["schedule"]
    assert (shown["silenced"], shown["open_alerts"]) == (None, 1)
