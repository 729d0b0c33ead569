"""The declarative schedule file: overrides stored schedules, logged diff, all or nothing."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from click.testing import CliRunner
from sqlalchemy import select

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.errors import DefinitionError
from celeryapp.interfaces import service
from celeryapp.interfaces.cli import main
from celeryapp.scheduling.schedule_file import apply_file
from models import Schedule, ScheduleSource, transaction
from tests.support import processes
from tests.support.helpers import call, entry_exists, executions, finished, step, wait_for, write_schedule_file
from tests.support.terminals import in_pty, screen_lines


def sources(app: ChordbeatCelery) -> dict[str, str]:
    with transaction(app.settings.database_url) as session:
        return {s.name: s.source.value for s in session.scalars(select(Schedule))}


def source_names(app: ChordbeatCelery) -> dict[str, str | None]:
    with transaction(app.settings.database_url) as session:
        return {s.name: s.source_name for s in session.scalars(select(Schedule))}


def test_file_overrides_stored_schedules_and_prunes_only_its_own(
    app: ChordbeatCelery, worker: Any, client: Celery, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    call(client, "chordbeat.apply_schedule", definition={"name": "api-made", "every": 60, "steps": [step("s")]})
    call(client, "chordbeat.apply_schedule", definition={"name": "shared", "every": 60, "steps": [step("s")]})
    first = write_schedule_file(
        tmp_path / "a.yaml",
        {"name": "from-file", "every": 30, "steps": [step("s")]},
        {"name": "shared", "every": 90, "steps": [step("s")]},
    )
    with caplog.at_level(logging.INFO, logger="celeryapp.scheduling.schedule_file"):
        diff = apply_file(app, first)
    assert (diff.added, diff.changed, diff.removed) == (["from-file"], ["shared"], [])
    assert diff.taken_over == {"shared": "the API"} and diff.fields == {"shared": ["every"]}
    assert "(source a) applied: added from-file; changed shared" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], "a successful apply logs no warning"
    assert sources(app) == {"api-made": "api", "from-file": "file", "shared": "file"}
    assert call(client, "chordbeat.get_schedule", name="shared")["every"] == 90
    assert entry_exists(app, "from-file")

    # The same file again: nothing changes. Then a file without "from-file": it goes, history kept.
    assert apply_file(app, first).empty
    execution_id = call(client, "chordbeat.trigger_schedule", name="from-file")["execution_id"]
    second = write_schedule_file(tmp_path / "b.yaml", {"name": "shared", "every": 90, "steps": [step("s")]}, source="a")
    diff = apply_file(app, second)
    assert (diff.added, diff.changed, diff.removed) == ([], [], ["from-file"])
    assert sources(app) == {"api-made": "api", "shared": "file"}
    assert not entry_exists(app, "from-file")
    assert call(client, "chordbeat.get_execution", execution_id=execution_id)["schedule"] == "from-file"


def test_an_invalid_file_changes_nothing_and_names_schedule_and_field(
    app: ChordbeatCelery, worker: Any, client: Celery, tmp_path: Path
) -> None:
    good = write_schedule_file(tmp_path / "good.yaml", {"name": "keep", "every": 30, "steps": [step("s")]})
    apply_file(app, good)
    bad = write_schedule_file(
        tmp_path / "bad.yaml",
        {"name": "new-one", "every": 30, "steps": [step("s")]},
        {"name": "broken", "cron": "0 2 * *", "steps": [step("s")]},
    )
    with pytest.raises(DefinitionError) as caught:
        apply_file(app, bad)
    assert str(caught.value) == "schedules[1] (broken).cron: expected 5 fields (minute hour day month weekday), got 4"
    assert sources(app) == {"keep": "file"}
    (tmp_path / "junk.yaml").write_text("schedules: [unclosed")
    with pytest.raises(DefinitionError, match="line 1, column 12: a '\\[' is never closed"):
        apply_file(app, tmp_path / "junk.yaml")
    with pytest.raises(DefinitionError, match="cannot be read"):
        apply_file(app, tmp_path / "missing.yaml")


def test_cli_apply_shows_the_diff_and_dry_run_changes_nothing(
    app: ChordbeatCelery, worker: Any, tmp_path: Path
) -> None:
    path = write_schedule_file(tmp_path / "s.yaml", {"name": "cli-made", "every": 30, "steps": [step("s")]})
    runner = CliRunner()
    dry = runner.invoke(main, ["apply", "--dry-run", str(path)])
    assert dry.exit_code == 0 and "+ cli-made" in dry.output and "would change (source s): added cli-made" in dry.output
    assert sources(app) == {}
    real = runner.invoke(main, ["apply", "--json", str(path)])
    assert real.exit_code == 0 and '"added": [\n    "cli-made"' in real.output
    broken = runner.invoke(main, ["apply", str(write_schedule_file(tmp_path / "x.yaml", {"name": "x", "steps": []}))])
    assert broken.exit_code == 1 and "schedules[0] (x).cron: exactly one of 'cron' and 'every'" in broken.output


def test_cli_apply_leaves_one_audit_row_with_the_file_and_nothing_for_a_dry_run_or_a_bad_actor(
    app: ChordbeatCelery, worker: Any, tmp_path: Path
) -> None:
    path = write_schedule_file(tmp_path / "ops.yaml", {"name": "audited", "every": 30, "steps": [step("s")]})
    runner = CliRunner()
    assert runner.invoke(main, ["apply", "--dry-run", str(path)]).exit_code == 0
    refused = runner.invoke(main, ["apply", "--as", "x\x1b[2J", str(path)])
    assert refused.exit_code == 1 and "actor" in refused.output
    assert service.list_audit(app) == [] and sources(app) == {}
    applied = runner.invoke(main, ["apply", "--as", "alice", "--reason", "release 42", str(path)])
    assert applied.exit_code == 0, applied.output
    (row,) = service.list_audit(app)
    assert (row["action"], row["source"], row["actor"], row["reason"]) == ("file_applied", "cli", "alice", "release 42")
    assert row["detail"]["file"] == str(path) and row["detail"]["added"] == 1


@pytest.mark.slow
def test_beat_applies_the_file_before_it_fires(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    path = write_schedule_file(tmp_path / "s.yaml", {"name": "declared", "every": 1, "steps": [step("s")]})
    settings_with_file = Settings(**{**settings.__dict__, "schedules_file": str(path)})
    with processes.beat(settings_with_file, tmp_path):
        wait_for(lambda: len(executions(app)) >= 2, 30, interval=0.2, what="fires of the declared schedule")
    assert sources(app) == {"declared": "file"}
    assert {e.schedule_name for e in executions(app)} == {"declared"}
    with transaction(app.settings.database_url) as session:
        assert session.scalar(select(Schedule.source)) is ScheduleSource.FILE


def test_a_file_prunes_only_its_own_source_never_an_earlier_files(
    app: ChordbeatCelery, worker: Any, client: Celery, tmp_path: Path
) -> None:
    """``apply other.yaml`` used to delete every schedule an earlier file had declared."""
    apply_file(
        app, write_schedule_file(tmp_path / "schedules.yaml", {"name": "nightly", "every": 60, "steps": [step("s")]})
    )
    finished(client, call(client, "chordbeat.trigger_schedule", name="nightly")["execution_id"])
    diff = apply_file(
        app, write_schedule_file(tmp_path / "other.yaml", {"name": "extra", "every": 60, "steps": [step("s")]})
    )
    assert (diff.source, diff.added, diff.removed) == ("other", ["extra"], [])
    assert source_names(app) == {"nightly": "schedules", "extra": "other"}
    assert call(client, "chordbeat.get_schedule", name="nightly")["run_count"] == 1
    # Two files that declare the same source are one source: the second replaces the first.
    hr = write_schedule_file(
        tmp_path / "hr-v2.yaml", {"name": "extra2", "every": 60, "steps": [step("s")]}, source="other"
    )
    assert apply_file(app, hr).removed == ["extra"]
    assert source_names(app) == {"nightly": "schedules", "extra2": "other"}


@pytest.mark.parametrize(
    ("source", "reason"),
    [(5, "got 5"), ("", "got ''"), ("a b", "got 'a b'"), ("x" * 201, "at most 200"), (True, "got True")],
)
def test_a_bad_source_name_is_refused(tmp_path: Path, source: Any, reason: str) -> None:
    from celeryapp.scheduling.schedule_file import read_file

    with pytest.raises(DefinitionError) as caught:
        read_file(write_schedule_file(tmp_path / "s.yaml", source=source), rules=None)
    assert caught.value.field == "source" and reason in caught.value.reason
    with pytest.raises(DefinitionError, match="source: the file name 'my schedules' is not a usable source name"):
        read_file(write_schedule_file(tmp_path / "my schedules.yaml"), rules=None)


def test_every_invalid_schedule_of_a_file_is_reported_at_once(tmp_path: Path) -> None:
    from celeryapp.scheduling.schedule_file import read_file

    path = write_schedule_file(
        tmp_path / "s.yaml",
        {"name": "a", "every": -1, "steps": [step("s")]},
        {"name": "ok", "every": 5, "steps": [step("s")]},
        {"name": "b", "cron": "0 2 * *", "steps": [step("s")]},
        {"name": "ok", "every": 5, "steps": [step("s")]},
    )
    with pytest.raises(DefinitionError) as caught:
        read_file(path, rules=None)
    lines = str(caught.value).splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "schedules[0] (a).every",
        "schedules[2] (b).cron",
        "schedules[3] (ok).name",
    ]
    many = write_schedule_file(tmp_path / "m.yaml", *({"name": f"n{i}", "steps": []} for i in range(30)))
    with pytest.raises(DefinitionError) as caught:
        read_file(many, rules=None)
    # Two mistakes each (no cadence, no steps): 60 in all, the first 20 listed.
    assert len(str(caught.value).splitlines()) == 21 and str(caught.value).endswith("... and 40 more")


def test_cli_apply_asks_before_removing_and_removes_nothing_unconfirmed(
    app: ChordbeatCelery, worker: Any, tmp_path: Path
) -> None:
    path = write_schedule_file(
        tmp_path / "s.yaml",
        {"name": "one", "every": 30, "steps": [step("s")]},
        {"name": "two", "every": 30, "steps": [step("s")]},
    )
    runner = CliRunner()
    assert runner.invoke(main, ["apply", str(path)]).exit_code == 0
    write_schedule_file(path, {"name": "one", "every": 45, "steps": [step("s")]})
    dry = runner.invoke(main, ["apply", "--dry-run", str(path)])
    assert dry.exit_code == 0 and "~ one (every)" in dry.output and "- two" in dry.output, dry.output
    refused = runner.invoke(main, ["apply", str(path)])  # no answer on stdin
    assert refused.exit_code == 1 and "nothing applied: removing two needs confirmation" in refused.output
    declined = runner.invoke(main, ["apply", str(path)], input="n\n")
    assert declined.exit_code == 1 and "- two" in declined.output
    assert set(sources(app)) == {"one", "two"}
    assert call_every(app, "one") == 30, "a declined apply changes nothing at all"
    confirmed = runner.invoke(main, ["apply", str(path)], input="y\n")
    assert confirmed.exit_code == 0 and "removed two" in confirmed.output, confirmed.output
    assert set(sources(app)) == {"one"} and call_every(app, "one") == 45
    write_schedule_file(path)
    pruned = runner.invoke(main, ["apply", "--prune", str(path)])
    assert pruned.exit_code == 0 and "removed one" in pruned.output and sources(app) == {}


def call_every(app: ChordbeatCelery, name: str) -> float | None:
    with transaction(app.settings.database_url) as session:
        return session.scalar(select(Schedule.every_s).where(Schedule.name == name))


def test_cli_apply_says_why_it_would_remove_schedules_another_file_of_the_same_name_applied(
    app: ChordbeatCelery, tmp_path: Path
) -> None:
    """Two files called schedules.yaml are one source: the second one's apply would remove the
    first one's schedules. At a terminal, 80 columns, the removal says why and what to do."""
    (tmp_path / "team-a").mkdir()
    (tmp_path / "team-b").mkdir()
    first = write_schedule_file(
        tmp_path / "team-a" / "schedules.yaml", {"name": "a-nightly", "every": 30, "steps": [step("s")]}
    )
    second = write_schedule_file(
        tmp_path / "team-b" / "schedules.yaml", {"name": "b-nightly", "every": 30, "steps": [step("s")]}
    )
    env = processes.settings_env(app.settings, TERM="xterm-256color")
    chordbeat = str(Path(processes.CELERY).with_name("chordbeat"))
    status, shown = in_pty([chordbeat, "apply", str(first)], env)
    assert status == 0, shown
    status, shown = in_pty([chordbeat, "apply", str(second)], env, replies={"[y/N]": "n\n"})
    lines = screen_lines(shown)
    said = " ".join(line.strip() for line in lines)
    assert status == 1 and all(len(line) <= 80 for line in lines), shown
    assert "- a-nightly" in lines, shown
    assert (
        "why '-': schedules.yaml is the source 'schedules' (its name without '.yaml'; a 'source:' in the file "
        "would name it otherwise); schedules applied from that source that the file does not name are removed. "
        "Another file of yours of that source? Give one of them its own 'source:'."
    ) in said, shown
    assert said.index("why '-'") < said.index("remove 1 schedule(s) of source schedules"), shown
    assert set(sources(app)) == {"a-nightly"}
