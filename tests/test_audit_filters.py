"""The global audit trail's filters as the contract has them: ``list_audit`` by actor, action and
time range, file applies (rows of no schedule) among all rows, paged by ``before_id``; hostile
filters refused naming the field, before anything is read."""

from __future__ import annotations

import json
import re
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from click.testing import CliRunner, Result

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.domain.times import iso
from celeryapp.interfaces.cli import main
from models import AuditAction, AuditSource, transaction, utcnow
from models.audit import record_audit
from tests.support import processes
from tests.support.helpers import call
from tests.support.terminals import in_pty, plain_lines, time_format_problems, wide_lines

CHORDBEAT = str(Path(sys.executable).with_name("chordbeat"))
RICH_STYLE = re.compile(r"\x1b\[[0-9;]*m")


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def seed(settings: Settings) -> None:
    """Five rows two days apart and now: a file apply (no schedule) among them."""
    now = utcnow()
    rows = [
        ("alice", AuditSource.CLI, AuditAction.PAUSE, "payroll", now - timedelta(days=2)),
        ("bob", AuditSource.WEB, AuditAction.RESUME, "payroll", now - timedelta(days=1, hours=1)),
        ("alice", AuditSource.CLI, AuditAction.FILE_APPLIED, None, now - timedelta(hours=3)),
        ("svc", AuditSource.SERVICE, AuditAction.PAUSE, "billing", now - timedelta(hours=2)),
        ("alice", AuditSource.WEB, AuditAction.TRIGGER, "billing", now - timedelta(minutes=5)),
    ]
    with transaction(settings.database_url) as session:
        for actor, source, action, schedule, at in rows:
            record_audit(session, actor=actor, source=source, action=action, schedule_name=schedule, at=at)


def picked(client: Celery, **kwargs: Any) -> list[tuple[str, str]]:
    return [(r["actor"], r["action"]) for r in call(client, "chordbeat.list_audit", **kwargs)]


def test_the_trail_filters_by_actor_action_and_time_and_pages_by_cursor(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings
) -> None:
    seed(settings)
    now = utcnow()
    assert picked(client, actor="alice") == [("alice", "trigger"), ("alice", "file_applied"), ("alice", "pause")]
    assert picked(client, action="pause") == [("svc", "pause"), ("alice", "pause")]
    assert picked(client, since=iso(now - timedelta(days=1))) == [
        ("alice", "trigger"),
        ("svc", "pause"),
        ("alice", "file_applied"),
    ]
    assert picked(client, since=iso(now - timedelta(days=3)), until=iso(now - timedelta(days=1))) == [
        ("bob", "resume"),
        ("alice", "pause"),
    ]
    assert picked(client, actor="alice", action="pause", since=iso(now - timedelta(days=3))) == [("alice", "pause")]
    # A file apply names no schedule and is among all rows.
    assert [r["schedule"] for r in call(client, "chordbeat.list_audit", action="file_applied")] == [None]
    # Paging: a page, then the rows before its last id, and nothing after the last page.
    first = call(client, "chordbeat.list_audit", limit=2)
    second = call(client, "chordbeat.list_audit", limit=2, before_id=first[-1]["id"])
    third = call(client, "chordbeat.list_audit", limit=2, before_id=second[-1]["id"])
    assert [r["action"] for r in first + second + third] == ["trigger", "pause", "file_applied", "resume", "pause"]
    assert call(client, "chordbeat.list_audit", before_id=third[-1]["id"]) == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"actor": 7}, "actor: must be a string, got int"),
        ({"actor": True}, "actor: must be a string, got boolean"),
        ({"actor": "x" * 10**6}, "actor: must be 1 to 100 characters, got 1000000"),
        ({"actor": "eve\u202eadmin"}, "actor: must not hold control, format or unassigned characters"),
        ({"action": "Pause"}, "action: must be one of apply, rollback, delete, pause"),
        ({"action": "p\u0430use"}, "action: must be one of apply, rollback, delete, pause"),  # a Cyrillic a
        ({"action": 3}, "action: must be one of apply, rollback, delete, pause"),
        ({"since": float("nan")}, "since: must be an ISO 8601 time with its UTC offset"),
        ({"since": True}, "since: must be an ISO 8601 time with its UTC offset"),
        ({"since": "2026-11-28T06:00:00"}, "since: must say its UTC offset"),
        ({"since": "yesterday"}, "since: is not an ISO 8601 time"),
        ({"since": "2" * 10**5}, "since: must be an ISO 8601 time (e.g. 2026-11-28T06:00:00Z"),
        ({"until": 1.5}, "until: must be an ISO 8601 time with its UTC offset"),
        (
            {"since": "2026-11-28T06:00:00Z", "until": "2026-11-28T05:00:00Z"},
            "until: must be after since (2026-11-28T06:00:00",
        ),
        ({"before_id": "5"}, "before_id: must be an integer (an audit row id), got string"),
        ({"before_id": 10**30}, "before_id: must be between 1 and"),
        ({"before_id": False}, "before_id: must be an integer (an audit row id), got boolean"),
        ({"execution_id": 0}, "execution_id: must be between 1 and"),
    ],
)
def test_hostile_filters_are_refused_naming_the_field(
    app: ChordbeatCelery, worker: Any, client: Celery, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(Exception) as refused:
        call(client, "chordbeat.list_audit", **kwargs)
    assert str(refused.value).startswith(message), refused.value
    assert type(refused.value).__name__ == "InvalidArgument"


def in_terminal(settings: Settings, *args: str) -> tuple[int, str]:
    """The real ``chordbeat`` in an 80-column terminal, in Kolkata: exit status and plain lines."""
    env = processes.settings_env(settings, TERM="xterm-256color", TZ="Asia/Kolkata")
    status, output = in_pty([CHORDBEAT, *args], env, columns=80)
    return status, "\n".join(plain_lines(RICH_STYLE.sub("", output)))


def test_chordbeat_audit_filters_by_actor_action_and_since_in_80_columns(
    app: ChordbeatCelery, worker: Any, settings: Settings
) -> None:
    seed(settings)
    status, text = in_terminal(settings, "audit", "--actor", "alice", "--since", "1d")
    assert status == 0, text
    lines = text.splitlines()
    assert not wide_lines(lines) and not time_format_problems(lines), text
    assert "trigger" in text and "file applied" in text and "pause" not in text and "bob" not in text, text
    assert "IST" in text  # rows of several schedules: in the viewer's zone
    # A time without an offset is the viewer's wall time (Kolkata), as the other time options read it.
    two_hours_ago = (utcnow() + timedelta(hours=5, minutes=30) - timedelta(hours=2, minutes=30)).strftime(
        "%Y-%m-%d %H:%M"
    )
    rows = json.loads(cli("audit", "--action", "pause", "--json").output)
    assert [r["actor"] for r in rows] == ["svc", "alice"]
    with_offset = json.loads(
        CliRunner(env={"TZ": "Asia/Kolkata"}).invoke(main, ["audit", "--since", two_hours_ago, "--json"]).output
    )
    assert [(r["actor"], r["action"]) for r in with_offset] == [("alice", "trigger"), ("svc", "pause")]
    # Hostile input is refused naming the flag, before anything is asked of the service.
    status, text = in_terminal(settings, "audit", "--since", "yesterday\x1b[2J")
    assert status == 2 and "--since" in text and "neither a length" in text and "\x1b[2J" not in text, text
    for args, flag in (
        (["--actor", "eve\u202eadmin"], "--actor"),
        (["--actor", "x" * 10**5], "--actor"),
        (["--action", "Pause"], "--action"),
        (["--action", "p\u0430use"], "--action"),
        (["--execution", "0"], "--execution"),
        (["--since", "2026-13-45"], "--since"),
    ):
        refused = cli("audit", *args)
        assert refused.exit_code == 2, (args, refused.output)
        assert re.search(f"Invalid value for '?{flag}'?:", refused.output), (args, refused.output)
