"""``chordbeat versions``, ``diff``, ``rollback`` and ``apply --dry-run``'s field-by-field diff, at an
80-column terminal against a real worker (docs/versions.md)."""

from __future__ import annotations

import re
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from celery import Celery

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from tests.support import processes
from tests.support.helpers import call, step
from tests.support.terminals import in_pty, plain_lines, screen_lines, time_format_problems, wide_lines

CHORDBEAT = str(Path(sys.executable).with_name("chordbeat"))


def _terminal(settings: Settings, *args: str, replies: dict[str, str] | None = None) -> tuple[int, list[str]]:
    environment = processes.settings_env(settings, TERM="xterm-256color", TZ="UTC")
    status, output = in_pty([CHORDBEAT, *args], environment, columns=80, timeout=60, replies=replies)
    lines = [line.rstrip() for line in screen_lines("\n".join(plain_lines(output)))]
    assert wide_lines(lines) == [] and time_format_problems(lines) == [], lines
    return status, lines


def _text(lines: list[str]) -> str:
    return " ".join(" ".join(lines).split())


def payroll(full: bool, every: int = 300) -> dict[str, Any]:
    return {"name": "payroll", "every": every, "steps": [step("HR import", kwargs={"full": full}), step("notify")]}


@pytest.mark.timeout(180)
def test_versions_diff_and_rollback_at_a_terminal(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    call(client, "chordbeat.apply_schedule", definition=payroll(False), actor="ann", reason="first")
    call(client, "chordbeat.apply_schedule", definition=payroll(True), actor="bob", reason="a full import each time")

    status, lines = _terminal(settings, "versions", "payroll")
    text = _text(lines)
    assert status == 0 and re.search(r"\b2 .*bob .*a full import each time", text), lines
    assert "ann" in text and "sha256 " in text, lines

    status, lines = _terminal(settings, "diff", "payroll", "1", "2")
    assert status == 0 and "~ steps[HR import].kwargs.full: false → true" in lines, lines
    status, lines = _terminal(settings, "diff", "payroll", "2", "2")
    assert status == 0 and "versions 2 and 2 of payroll are the same definition" in _text(lines), lines
    status, lines = _terminal(settings, "diff", "payroll", "1", "0")
    assert status == 2 and "Invalid value for 'B'" in _text(lines), lines

    # Asked why and whether, after seeing what would change; "n" changes nothing.
    replies = {"why roll back to version 1?": "the full import broke\n", "[y/N]": "n\n"}
    status, lines = _terminal(settings, "rollback", "payroll", "--to", "1", replies=replies)
    assert status == 1 and "~ steps[HR import].kwargs.full: true → false" in lines, lines
    assert call(client, "chordbeat.get_schedule", name="payroll")["version"] == 2
    status, lines = _terminal(settings, "rollback", "payroll", "--to", "1", replies={**replies, "[y/N]": "y\n"})
    assert status == 0 and "payroll: version 3 (the definition of version 1)" in _text(lines), lines
    row = call(client, "chordbeat.list_audit", schedule="payroll", limit=1)[0]
    assert (row["action"], row["reason"], row["source"]) == ("rollback", "the full import broke", "service")
    status, lines = _terminal(settings, "rollback", "payroll", "--to", "1", "--yes")
    assert status == 0 and "version 3 is the definition of version 1; nothing to do" in _text(lines), lines

    # A file: its dry run shows field by field what its apply would change; the apply names the commit.
    path = tmp_path / "payroll.yaml"
    path.write_text(yaml.safe_dump({"schedules": [payroll(False, every=600)]}))
    status, lines = _terminal(settings, "apply", str(path), "--dry-run")
    assert status == 0 and "    ~ every: 300 → 600" in lines, lines
    assert call(client, "chordbeat.get_schedule", name="payroll")["version"] == 3
    status, lines = _terminal(settings, "apply", str(path), "--commit", "4f2c9e1", "--as", "dave")
    assert status == 0, lines
    newest = call(client, "chordbeat.list_versions", name="payroll", limit=1)[0]
    assert (newest["version"], newest["actor"], newest["commit"], newest["file"]) == (4, "dave", "4f2c9e1", str(path))
    status, lines = _terminal(settings, "versions", "payroll", "--limit", "1")
    assert status == 0 and "@ 4f2c9e1" in _text(lines), lines


@pytest.mark.timeout(120)
def test_runs_of_one_version_and_a_rerun_of_the_current_definition(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings
) -> None:
    call(client, "chordbeat.apply_schedule", definition={**payroll(False), "overlap": "allow"})
    first = call(client, "chordbeat.trigger_schedule", name="payroll")["execution_id"]
    call(client, "chordbeat.cancel_execution", execution_id=first)
    call(client, "chordbeat.apply_schedule", definition={**payroll(True), "overlap": "allow"})
    status, lines = _terminal(settings, "executions", "--schedule", "payroll", "--version", "1", "--limit", "1")
    assert status == 0 and re.search(rf"\b{first}\b.*payroll", _text(lines)), lines
    assert "--version 1 --limit 1 --before" in _text(lines), lines  # the next page keeps the filter
    status, lines = _terminal(settings, "executions", "--schedule", "payroll", "--version", "2")
    assert status == 0 and "payroll" not in _text(lines), lines
    status, lines = _terminal(settings, "executions", "--version", "2")
    assert status == 1 and "version: needs schedule" in _text(lines), lines
    status, lines = _terminal(settings, "rerun", str(first), "--latest")
    assert status == 0 and "from group 1 (latest: version 2)" in _text(lines), lines
    # A backfill of version 1's steps, though version 2 is current.
    for last in ("a", "b"):
        call(
            client,
            "chordbeat.apply_schedule",
            definition={"name": "hourly", "cron": "0 * * * *", "steps": [step(last)]},
        )
    since, until = ((datetime.now(UTC) - timedelta(hours=h)).strftime("%Y-%m-%d %H:%M") for h in (3, 0.02))
    backfill = ("backfill", "hourly", "--from", since, "--to", until, "--version", "1", "--yes")
    status, lines = _terminal(settings, *backfill)
    assert status == 0, lines
    runs = call(client, "chordbeat.list_executions", schedule="hourly", version=1)
    assert runs and {r["trigger"] for r in runs} == {"backfill"}, runs
    assert call(client, "chordbeat.get_execution", execution_id=runs[0]["id"])["groups"] == [["a"]]
