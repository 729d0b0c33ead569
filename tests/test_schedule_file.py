"""The declarative schedule file: overrides stored schedules, logged diff, all or nothing."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import yaml
from celery import Celery
from click.testing import CliRunner
from sqlalchemy import select

from celeryapp.app import ChordbeatCelery
from celeryapp.cli import main
from celeryapp.config import Settings
from celeryapp.errors import DefinitionError
from celeryapp.schedule_file import apply_file
from models import Schedule, ScheduleSource, transaction
from tests import processes
from tests.helpers import call, entry_exists, executions, step, wait_for


def write(path: Path, *schedules: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump({"schedules": list(schedules)}))
    return path


def sources(app: ChordbeatCelery) -> dict[str, str]:
    with transaction(app.settings.database_url) as session:
        return {s.name: s.source.value for s in session.scalars(select(Schedule))}


def test_file_overrides_stored_schedules_and_prunes_only_its_own(
    app: ChordbeatCelery, worker: Any, client: Celery, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    call(client, "chordbeat.apply_schedule", definition={"name": "api-made", "every": 60, "steps": [step("s")]})
    call(client, "chordbeat.apply_schedule", definition={"name": "shared", "every": 60, "steps": [step("s")]})
    first = write(
        tmp_path / "a.yaml",
        {"name": "from-file", "every": 30, "steps": [step("s")]},
        {"name": "shared", "every": 90, "steps": [step("s")]},
    )
    with caplog.at_level(logging.WARNING, logger="celeryapp.schedule_file"):
        diff = apply_file(app, first)
    assert (diff.added, diff.changed, diff.removed) == (["from-file"], ["shared"], [])
    assert "added from-file; changed shared" in caplog.text
    assert sources(app) == {"api-made": "api", "from-file": "file", "shared": "file"}
    assert call(client, "chordbeat.get_schedule", name="shared")["every"] == 90
    assert entry_exists(app, "from-file")

    # The same file again: nothing changes. Then a file without "from-file": it goes, history kept.
    assert apply_file(app, first).empty
    execution_id = call(client, "chordbeat.trigger_schedule", name="from-file")["execution_id"]
    second = write(tmp_path / "b.yaml", {"name": "shared", "every": 90, "steps": [step("s")]})
    diff = apply_file(app, second)
    assert (diff.added, diff.changed, diff.removed) == ([], [], ["from-file"])
    assert sources(app) == {"api-made": "api", "shared": "file"}
    assert not entry_exists(app, "from-file")
    assert call(client, "chordbeat.get_execution", execution_id=execution_id)["schedule"] == "from-file"


def test_an_invalid_file_changes_nothing_and_names_schedule_and_field(
    app: ChordbeatCelery, worker: Any, client: Celery, tmp_path: Path
) -> None:
    good = write(tmp_path / "good.yaml", {"name": "keep", "every": 30, "steps": [step("s")]})
    apply_file(app, good)
    bad = write(
        tmp_path / "bad.yaml",
        {"name": "new-one", "every": 30, "steps": [step("s")]},
        {"name": "broken", "cron": "0 2 * *", "steps": [step("s")]},
    )
    with pytest.raises(DefinitionError) as caught:
        apply_file(app, bad)
    assert str(caught.value) == "schedules[1] (broken).cron: expected 5 fields (minute hour day month weekday), got 4"
    assert sources(app) == {"keep": "file"}
    (tmp_path / "junk.yaml").write_text("schedules: [unclosed")
    with pytest.raises(DefinitionError, match="is not valid YAML"):
        apply_file(app, tmp_path / "junk.yaml")
    with pytest.raises(DefinitionError, match="cannot be read"):
        apply_file(app, tmp_path / "missing.yaml")


def test_cli_apply_shows_the_diff_and_dry_run_changes_nothing(
    app: ChordbeatCelery, worker: Any, tmp_path: Path
) -> None:
    path = write(tmp_path / "s.yaml", {"name": "cli-made", "every": 30, "steps": [step("s")]})
    runner = CliRunner()
    dry = runner.invoke(main, ["apply", "--dry-run", str(path)])
    assert dry.exit_code == 0 and "+ cli-made" in dry.output and "would change: added cli-made" in dry.output
    assert sources(app) == {}
    real = runner.invoke(main, ["apply", "--json", str(path)])
    assert real.exit_code == 0 and '"added": [\n    "cli-made"' in real.output
    broken = runner.invoke(main, ["apply", str(write(tmp_path / "x.yaml", {"name": "x", "steps": []}))])
    assert broken.exit_code == 1 and "schedules[0] (x).cron: exactly one of 'cron' and 'every'" in broken.output


@pytest.mark.slow
def test_beat_applies_the_file_before_it_fires(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    path = write(tmp_path / "s.yaml", {"name": "declared", "every": 1, "steps": [step("s")]})
    settings_with_file = Settings(**{**settings.__dict__, "schedules_file": str(path)})
    with processes.beat(settings_with_file, tmp_path):
        wait_for(lambda: len(executions(app)) >= 2, 30, interval=0.2, what="fires of the declared schedule")
    assert sources(app) == {"declared": "file"}
    assert {e.schedule_name for e in executions(app)} == {"declared"}
    with transaction(app.settings.database_url) as session:
        assert session.scalar(select(Schedule.source)) is ScheduleSource.FILE
