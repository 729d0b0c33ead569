"""A schedule file's apply in bulk (issue 41): a few statements per thousand schedules, the rows a
schedule applied alone gets, one read of the file, and a file size limit the operator sets."""

from __future__ import annotations

import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import select, text

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.domain.cadence import cadence_of
from celeryapp.domain.validation import parse_definitions
from celeryapp.errors import ConfigError, DefinitionError
from celeryapp.interfaces.cli import main
from celeryapp.scheduling import schedule_file
from celeryapp.scheduling.schedule_file import apply_definitions, apply_file
from celeryapp.scheduling.store import Change, upsert_schedule
from celeryapp.states import AuditSource
from models import Schedule, ScheduleSource, ScheduleStep, transaction
from models.audit import Actor
from models.version_tables import ScheduleVersion
from models.versions import VersionOrigin
from tests.support.helpers import recorded_statements, step, write_schedule_file

ORIGIN = VersionOrigin("ann", AuditSource.CLI, "release", file="hr.yaml", commit="abc123")


def simple(name: str, every: int = 60) -> dict[str, Any]:
    return {"name": name, "every": every, "steps": [step("s")]}


@pytest.mark.both_databases
def test_applying_a_file_costs_the_same_statements_for_50_schedules_as_for_500(
    app: ChordbeatCelery, tmp_path: Path
) -> None:
    """One ORM upsert per schedule sent six statements a schedule (3,000 for 500)."""

    def counted(path: Path) -> list[str]:
        with recorded_statements(app, words=3) as statements:
            apply_file(app, path, actor=Actor("ann", AuditSource.CLI))
        return statements

    for kind, every in (("added", 60), ("changed", 90)):
        few = counted(write_schedule_file(tmp_path / "few.yaml", *(simple(f"few-{i}", every) for i in range(50))))
        many = counted(write_schedule_file(tmp_path / "many.yaml", *(simple(f"many-{i}", every) for i in range(500))))
        assert len(many) == len(few) <= 25, (kind, few, many)
    # Unchanged: reads only (and the audit row).
    again = counted(tmp_path / "many.yaml")
    assert not [s for s in again if s.split()[0] in ("UPDATE", "DELETE")], again


NULLS = ", ".join(
    f"{column} IS NULL" for column in ("payload", "deadlines", "alerts", "calendar", "catchup", "dst", "uses")
)


def snapshot(url: str) -> dict[str, Any]:
    """The stored schedules, steps and versions, without ids and with times as offsets from the
    schedule's ``updated_at`` (the two paths ran at different instants; creation apart), and whether each next run
    is its cadence's."""

    def plain(row: Any, anchor: datetime | None, leave_out: set[str]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for column in row.__table__.columns:
            value = getattr(row, column.name)
            if column.name in leave_out:
                continue
            out[column.name] = value - anchor if isinstance(value, datetime) and anchor is not None else value
        return out

    with transaction(url, read_only=True) as session:
        schedules = {s.id: s for s in session.scalars(select(Schedule))}
        return {
            "schedules": {
                s.name: plain(s, s.updated_at, {"id", "next_run_at", "created_at"}) for s in schedules.values()
            },
            # A cron's next slot is a time of day, not an offset from the change: checked as the cadence's.
            "next_runs": {
                s.name: s.next_run_at == (cadence_of(s).slot_after(s.updated_at) if s.enabled else None)
                for s in schedules.values()
            },
            "steps": sorted(
                (
                    (schedules[t.schedule_id].name, plain(t, None, {"id", "schedule_id"}))
                    for t in session.scalars(select(ScheduleStep))
                ),
                key=str,
            ),
            # SQL NULL or JSON null, as the rows hold them (both read back as None).
            "nulls": sorted(map(tuple, session.execute(text(f"SELECT name, {NULLS} FROM schedules")))),
            "step_nulls": sorted(map(tuple, session.execute(text("SELECT name, uses IS NULL FROM schedule_steps")))),
            "versions": sorted(
                (v.schedule_name, v.version, v.hash, v.definition, v.actor, v.source, v.reason, v.file, v.commit)
                for v in session.scalars(select(ScheduleVersion))
            ),
        }


def test_a_file_stores_what_applying_each_of_its_schedules_alone_stores(
    app: ChordbeatCelery, database_url: str, sqlite_template: Path, tmp_path: Path
) -> None:
    """The bulk path against the single change's (``upsert_schedule``), on two databases: the same
    definitions give the same rows, versions (canonical text, hash, origin) and answers."""
    alone = tmp_path / "alone.db"
    shutil.copy(sqlite_template, alone)
    urls = {"bulk": database_url, "alone": f"sqlite:///{alone}"}
    rich = {
        "name": "payroll",
        "cron": "30 2 * * 1-5",
        "timezone": "Europe/Paris",
        "overlap": "skip",
        "max_retries": 3,
        "retry_delay": 120,
        "timeout": 600,
        "payload": {"team": "hr", "é": [1, 2.5, None, True]},
        "catchup": {"policy": "latest"},
        "steps": [step("fetch"), [step("a", kwargs={"n": 1}), step("b", queue="slow")], step("load")],
    }
    paused = {**simple("paused"), "enabled": False}
    first = [rich, paused, simple("plain"), simple("api-made")]
    second = [{**rich, "timeout": 900}, paused, simple("plain", 30), simple("api-made"), simple("new")]
    for url in urls.values():
        with transaction(url) as session:
            definition = parse_definitions([simple("api-made")])[0]
            upsert_schedule(session, definition, source=ScheduleSource.API, now=schedule_file.utcnow(), origin=ORIGIN)
    for documents in (first, second):
        definitions = parse_definitions(documents)
        with transaction(urls["bulk"]) as session:
            diff = apply_definitions(session, definitions, source="hr", origin=ORIGIN)
        with transaction(urls["alone"]) as session:
            changes: dict[Change, list[str]] = {change: [] for change in Change}
            for definition in definitions:
                now = schedule_file.utcnow()
                _, change = upsert_schedule(
                    session, definition, source=ScheduleSource.FILE, source_name="hr", now=now, origin=ORIGIN
                )
                changes[change].append(definition.name)
        assert (diff.added, diff.changed, diff.unchanged) == (
            changes[Change.ADDED],
            changes[Change.CHANGED],
            changes[Change.UNCHANGED],
        )
        assert snapshot(urls["bulk"]) == snapshot(urls["alone"])
    assert (diff.added, diff.changed) == (["new"], ["payroll", "plain"]) and diff.taken_over == {}


def test_the_command_reads_the_file_once_for_its_dry_run_and_its_apply(
    app: ChordbeatCelery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It read it twice: 3.5 s of a 2,000-schedule file each time, and what it confirmed could
    differ from what it applied had the file changed meanwhile."""
    path = write_schedule_file(tmp_path / "s.yaml", simple("one"), simple("two"))
    assert CliRunner().invoke(main, ["apply", str(path)]).exit_code == 0
    write_schedule_file(path, simple("one", 45))
    reads: list[str] = []
    original = schedule_file.read_file

    def counted(*args: Any, **kwargs: Any) -> schedule_file.ScheduleFile:
        reads.append(str(args[0]))
        return original(*args, **kwargs)

    monkeypatch.setattr(schedule_file, "read_file", counted)
    applied = CliRunner().invoke(main, ["apply", str(path)], input="y\n")
    assert applied.exit_code == 0 and "removed two" in applied.output and "changed one" in applied.output
    assert reads == [str(path)]


def test_a_file_over_the_limit_is_refused_unparsed_naming_the_setting(app: ChordbeatCelery, tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    # Not YAML at all: a refusal that names the size was given before any parsing.
    path.write_text("schedules: [unclosed\n" + "#" * 5000 + "\n")
    app.apply_settings(Settings(**{**app.settings.__dict__, "schedule_file_max_bytes": 4096}))
    with pytest.raises(DefinitionError, match=r"is larger than 4096 bytes \(CHORDBEAT_SCHEDULE_FILE_MAX_BYTES\)"):
        apply_file(app, path)
    app.apply_settings(Settings(**{**app.settings.__dict__, "schedule_file_max_bytes": 8192}))
    with pytest.raises(DefinitionError, match="a '\\[' is never closed"):
        apply_file(app, path)
    write_schedule_file(path, simple("fits"))
    assert apply_file(app, path).added == ["fits"]


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ("1e9", "expected a number of bytes of at least 4096"),
        ("-1", "expected a number of bytes of at least 4096"),
        ("100", "expected a number of bytes of at least 4096"),
        ("9" * 40, "expected a number of bytes"),
        (str(32 * 1024 * 1024 + 1), "must be at most 33554432"),
    ],
)
def test_a_hostile_file_size_limit_is_refused_naming_the_variable(raw: str, said: str) -> None:
    with pytest.raises(ConfigError, match="CHORDBEAT_SCHEDULE_FILE_MAX_BYTES") as refused:
        Settings.from_env({"CHORDBEAT_SCHEDULE_FILE_MAX_BYTES": raw})
    assert said in str(refused.value)
    assert Settings.from_env({}).schedule_file_max_bytes == 4 * 1024 * 1024
    assert Settings.from_env({"CHORDBEAT_SCHEDULE_FILE_MAX_BYTES": "16777216"}).schedule_file_max_bytes == 16777216
