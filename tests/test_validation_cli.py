"""Every mistake at once where people and services meet it: `chordbeat apply FILE` in an 80-column
terminal and the `chordbeat.apply_schedule` service task; broken YAML as a person reads it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from tests.support import processes
from tests.support.helpers import call
from tests.support.terminals import in_pty, screen_lines

CHORDBEAT = str(Path(sys.executable).with_name("chordbeat"))
#: The issue's schedule: four mistakes (name, zone alias, cron field, task) that took four rounds.
FOUR_MISTAKES_YAML = """\
schedules:
  - name: nightly hr
    timezone: US/Eastern
    cron: "0 25 * * *"
    steps:
      - {name: "HR import", task: chordbeat.examples.sleeep}
"""
FOUR_MISTAKES = {
    "name": "nightly hr",
    "timezone": "US/Eastern",
    "cron": "0 25 * * *",
    "steps": [{"name": "HR import", "task": "chordbeat.examples.sleeep"}],
}
#: What each of the four says (field path and reason); the task's reason depends on who checks.
SAID = (
    "name: must start with a letter or digit and hold only letters, digits, '.', '_' and '-' "
    "(at most 200 characters), got 'nightly hr'",
    "timezone: 'US/Eastern' is an alias; use the canonical zone 'America/New_York'",
    "cron: hour field: 25 is outside 0-23",
    "steps[0].task: task 'chordbeat.examples.sleeep' is not registered",
)


def words(lines: list[str]) -> str:
    """The text as a reader takes it in: lines joined, indentation gone. A word broken across two
    lines shows as two words here, and no longer matches."""
    return " ".join(line.strip() for line in lines if line.strip())


def apply_in_terminal(settings: Settings, path: Path) -> tuple[int, list[str]]:
    # Named from its own directory, as a person types it: a temporary directory's path is longer
    # than some lines are wide, and a path is never broken (it would not paste back).
    status, output = in_pty([CHORDBEAT, "apply", path.name], processes.settings_env(settings), cwd=str(path.parent))
    return status, [line for line in screen_lines(output) if line]


def test_a_file_with_four_mistakes_is_refused_once_naming_all_four_within_80_columns(
    app: ChordbeatCelery, settings: Settings, tmp_path: Path
) -> None:
    path = tmp_path / "hr.yaml"
    path.write_text(FOUR_MISTAKES_YAML)
    status, lines = apply_in_terminal(settings, path)
    assert status == 1, lines
    assert lines[0] == "Error: 4 mistakes; nothing applied:"
    assert all(len(line) <= 80 for line in lines), lines
    said = words(lines)
    for mistake in SAID:
        assert f"schedules[0].{mistake}" in said, (mistake, lines)
    # Each mistake starts a line of its own; its continuation lines are indented further.
    assert [line.split(":")[0].strip() for line in lines if line.startswith("  schedules")] == [
        "schedules[0].name",
        "schedules[0].timezone",
        "schedules[0].cron",
        "schedules[0].steps[0].task",
    ]


def test_broken_yaml_in_the_terminal_shows_the_place_the_line_and_a_caret(
    app: ChordbeatCelery, settings: Settings, tmp_path: Path
) -> None:
    path = tmp_path / "hr.yaml"
    path.write_text("schedules:\n  - name: nightly-hr\n    cron 0 2 * *\n    every: 5\n")
    status, lines = apply_in_terminal(settings, path)
    assert status == 1, lines
    assert words(lines[:-2]) == f"Error: {path.name}: line 3, column 5: expected ':' after a key (write 'key: value')"
    assert lines[-2:] == ["    3 |     cron 0 2 * *", "      |     ^"]
    assert all(len(line) <= 80 for line in lines), lines
    for jargon in ("yaml.", "Error:" + " ", "ScannerError", "while scanning", "Mark"):
        assert jargon not in "\n".join(lines).replace("Error: ", "", 1), jargon


def test_the_service_task_refuses_the_four_mistakes_in_one_error(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    with pytest.raises(Exception) as caught:
        call(client, "chordbeat.apply_schedule", definition=FOUR_MISTAKES)
    assert type(caught.value).__name__ == "DefinitionError"
    lines = str(caught.value).splitlines()
    assert len(lines) == 4, lines
    for line, mistake in zip(lines, SAID, strict=True):
        assert line.startswith(mistake), (line, mistake)
    # Checked against the live worker that consumes the step's queue, which said what it has.
    assert lines[3].endswith("on the workers of queue 'chordbeat' " + f"({worker.hostname})"), lines[3]
