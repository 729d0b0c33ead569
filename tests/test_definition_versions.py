"""Definition versions: every change of a schedule's definition stores version n+1 with who made it,
from where and why, in the change's own transaction; nothing else does (docs/versions.md)."""

from __future__ import annotations

import json
import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from celery import Celery
from sqlalchemy import create_engine, insert, select, text, update

from celeryapp.application import ChordbeatCelery
from celeryapp.domain.definition_versions import canonical_json, definition_hash
from celeryapp.errors import InvalidArgument, NotFound
from celeryapp.interfaces import limit_service, service, version_service
from celeryapp.interfaces.backfill_service import backfill_schedule
from celeryapp.interfaces.next_fires import next_fires
from celeryapp.recovery import housekeeping
from celeryapp.scheduling.schedule_file import apply_file
from celeryapp.states import AuditSource
from models import Schedule, ScheduleExecution, ScheduleVersion, transaction, utcnow
from models.audit import BEAT, Actor
from models.definitions import definition_of
from models.migrate import upgrade
from models.version_tables import SCHEDULE_VERSIONS
from models.versions import VersionOrigin, record_version
from tests.support.helpers import call, execution, finished, recorded_statements, running, start_and_hold, step


def stored_versions(app: ChordbeatCelery, name: str) -> list[ScheduleVersion]:
    with transaction(app.settings.database_url, read_only=True) as session:
        schedule = session.scalars(select(Schedule).where(Schedule.name == name)).one()
        rows = list(session.scalars(select(ScheduleVersion).where(ScheduleVersion.schedule_id == schedule.id)))
        session.expunge_all()
    return sorted(rows, key=lambda row: row.version)


@pytest.mark.both_databases
def test_each_definition_change_makes_the_next_version_and_nothing_else_does(app: ChordbeatCelery) -> None:
    definition = {"name": "hr-sync", "every": 60, "steps": [step("HR import", kwargs={"full": False})]}
    first = service.apply_schedule(app, definition, actor="ann", reason="first")
    assert first["version"] == 1
    # The same definition again, pausing and resuming: operational state, not the definition.
    assert service.apply_schedule(app, definition, actor="bob")["version"] == 1
    service.pause_schedule(app, "hr-sync", actor="bob")
    service.resume_schedule(app, "hr-sync", actor="bob")
    changed = {**definition, "steps": [step("HR import", kwargs={"full": True})], "timezone": "Europe/Paris"}
    second = service.apply_schedule(app, changed, actor="carol", reason="full import")
    assert second["version"] == 2 and service.get_schedule(app, "hr-sync")["version"] == 2

    versions = stored_versions(app, "hr-sync")
    assert [(v.version, v.actor, v.source, v.reason) for v in versions] == [
        (1, "ann", "service", "first"),
        (2, "carol", "service", "full import"),
    ]
    with transaction(app.settings.database_url, read_only=True) as session:
        current = definition_of(session.scalars(select(Schedule).where(Schedule.name == "hr-sync")).one()).to_json()
    # The canonical text of the whole definition, as the store reads it back, and its hash.
    assert (
        versions[1].definition == canonical_json(current) == json.dumps(current, sort_keys=True, separators=(",", ":"))
    )
    assert versions[1].hash == definition_hash(versions[1].definition)
    assert json.loads(versions[0].definition)["steps"][0]["kwargs"] == {"full": False}


def test_a_file_apply_names_the_file_and_the_commit_it_was_read_at(app: ChordbeatCelery, tmp_path: Path) -> None:
    repository = tmp_path / "repo"
    repository.mkdir()
    path = repository / "schedules.yaml"

    def write(every: int) -> None:
        path.write_text(yaml.safe_dump({"schedules": [{"name": "from-git", "every": every, "steps": [step("s")]}]}))

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(repository), *args], capture_output=True, text=True, check=True)
        return done.stdout.strip()

    git("init", "-q")
    write(60)
    git("add", "schedules.yaml")
    git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "first")
    apply_file(app, path, actor=Actor("ann", AuditSource.CLI), reason="deploy")
    write(120)  # not committed: the version says so
    apply_file(app, path, actor=Actor("ann", AuditSource.CLI))
    apply_file(app, path, actor=Actor("ann", AuditSource.CLI), commit="v2-tag")  # unchanged: no version
    write(180)
    apply_file(app, path, actor=Actor("bob", AuditSource.CLI), commit="abc123")

    head = git("rev-parse", "HEAD")
    versions = stored_versions(app, "from-git")
    assert [(v.version, v.actor, v.source, v.reason, v.file, v.commit) for v in versions] == [
        (1, "ann", "cli", "deploy", str(path), head),
        (2, "ann", "cli", None, str(path), f"{head}-dirty"),
        (3, "bob", "cli", None, str(path), "abc123"),
    ]
    outside = tmp_path / "elsewhere.yaml"
    outside.write_text(yaml.safe_dump({"schedules": [{"name": "no-git", "every": 60, "steps": [step("s")]}]}))
    apply_file(app, outside, actor=Actor("ann", AuditSource.CLI))
    assert [(v.file, v.commit) for v in stored_versions(app, "no-git")] == [(str(outside), None)]


@pytest.mark.both_databases
def test_the_schedules_stored_before_versions_get_their_definition_as_version_1(
    app: ChordbeatCelery, database_url: str
) -> None:
    from alembic import command

    from models.migrate import alembic_config

    definitions: list[dict[str, Any]] = [
        {"name": "older", "cron": "0 6 * * *", "steps": [step("a"), [step("b"), step("c")]], "payload": {"k": 1}},
        {"name": "edited", "every": 30, "steps": [step("a")]},
    ]
    for definition in definitions:
        service.apply_schedule(app, definition)
    service.apply_schedule(app, {**definitions[1], "every": 45})
    with transaction(database_url, read_only=True) as session:
        expected = {s.name: definition_of(s).to_json() for s in session.scalars(select(Schedule))}
    command.downgrade(alembic_config(database_url), "0016")
    upgrade(database_url)
    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                text(
                    "SELECT s.name, s.version, v.version, v.definition, v.hash FROM schedules s"
                    " JOIN schedule_versions v ON v.schedule_id = s.id ORDER BY s.name"
                )
            ).all()
    finally:
        engine.dispose()
    assert [(name, current, version) for name, current, version, _, _ in rows] == [("edited", 1, 1), ("older", 1, 1)]
    for name, _, _, stored, digest in rows:
        assert stored == canonical_json(expected[name]) and digest == definition_hash(stored)


@pytest.mark.both_databases
@pytest.mark.timeout(90)
def test_a_change_applied_mid_run_leaves_the_runs_later_groups_on_its_version(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    def definition(said: str, groups: list[str]) -> dict[str, Any]:
        later = [step(name, task="chordbeat.examples.warn", kwargs={"message": said}) for name in groups]
        return {
            "name": "five-groups",
            "every": 3600,
            "steps": [step("one", kwargs={"seconds": 0.01}), step("two", kwargs={"seconds": 3}), *later],
        }

    call(client, "chordbeat.apply_schedule", definition=definition("old", ["three", "four", "five"]))
    started = call(client, "chordbeat.trigger_schedule", name="five-groups")
    running(client, started["execution_id"], "two")
    # The new definition says something else in every later group, and has a sixth.
    changed = call(client, "chordbeat.apply_schedule", definition=definition("new", ["three", "four", "five", "six"]))
    assert changed["version"] == 2
    # Applied while the run is in its second group: the case under test, not one that missed it.
    assert execution(client, started["execution_id"])["current_step_index"] == 1

    done = finished(client, started["execution_id"])
    assert done["status"] == "completed" and done["version"] == 1
    said = [(a["step"], a["message"]) for a in done["activities"] if a["step"] not in ("one", "two")]
    assert said == [("three", "old"), ("four", "old"), ("five", "old")], said
    summary = call(client, "chordbeat.list_executions", schedule="five-groups", version=1)
    assert [(s["id"], s["version"]) for s in summary] == [(started["execution_id"], 1)]
    assert call(client, "chordbeat.list_executions", schedule="five-groups", version=2) == []


def test_a_rerun_runs_its_sources_version_unless_asked_for_the_latest(app: ChordbeatCelery) -> None:
    def definition(last: str) -> dict[str, Any]:
        return {"name": "rerun-me", "every": 3600, "overlap": "allow", "steps": [step("first"), step(last)]}

    service.apply_schedule(app, definition("old-last"))
    source, _effects = start_and_hold(app, "rerun-me")
    service.cancel_execution(app, source)
    service.apply_schedule(app, definition("new-last"))
    own = service.rerun_execution(app, source, from_failed=False)
    assert (own["version"], own["groups"]) == (1, [["first"], ["old-last"]])
    latest = service.rerun_execution(app, source, from_failed=False, latest=True)
    assert (latest["version"], latest["groups"]) == (2, [["first"], ["new-last"]])
    with pytest.raises(InvalidArgument, match=r"^latest: "):
        service.rerun_execution(app, source, latest="yes")
    for bad in (0, -1, True, float("nan"), 2**63, "1"):
        with pytest.raises(InvalidArgument, match=r"^version: "):
            service.list_executions(app, "rerun-me", version=bad)
    with pytest.raises(InvalidArgument, match=r"^version: needs schedule"):
        service.list_executions(app, version=1)


@pytest.mark.both_databases
def test_versions_are_listed_compared_and_rolled_back_to(app: ChordbeatCelery) -> None:
    def definition(full: bool, *extra: dict[str, Any]) -> dict[str, Any]:
        steps = [step("HR import", kwargs={"full": full}), *extra]
        return {"name": "payroll", "every": 300, "steps": steps}

    service.apply_schedule(app, definition(False), actor="ann", reason="first")
    service.apply_schedule(app, definition(True, step("notify")), actor="bob", reason="full import")
    listed = version_service.list_versions(app, "payroll")
    assert [(v["version"], v["actor"], v["reason"], v["source"]) for v in listed] == [
        (2, "bob", "full import", "service"),
        (1, "ann", "first", "service"),
    ]
    assert set(listed[0]) == {"version", "at", "actor", "source", "reason", "file", "commit", "hash"}
    assert [v["version"] for v in version_service.list_versions(app, "payroll", limit=1, before=2)] == [1]

    assert version_service.get_version(app, "payroll", 1)["steps"][0]["kwargs"] == {"full": False}
    diff = version_service.diff_versions(app, "payroll", 1, 2)
    assert [(d["path"], d["op"]) for d in diff] == [
        ("steps[HR import].kwargs.full", "changed"),
        ("steps[notify]", "added"),
        ("groups", "changed"),
    ]
    assert (diff[0]["old"], diff[0]["new"]) == (False, True)
    assert version_service.diff_versions(app, "payroll", 2, 2) == []

    # Each coming slot's run would run the current version.
    assert {fire["version"] for fire in next_fires(app, "payroll", 3)} == {2}
    rolled = version_service.rollback_schedule(app, "payroll", 1, actor="carol", reason="the import broke")
    assert rolled["version"] == 3 and rolled["steps"] == version_service.get_version(app, "payroll", 1)["steps"]
    assert version_service.diff_versions(app, "payroll", 1, 3) == []
    assert version_service.list_versions(app, "payroll")[0]["actor"] == "carol"
    row = service.list_audit(app, "payroll", limit=1)[0]
    assert (row["action"], row["actor"], row["reason"]) == ("rollback", "carol", "the import broke")
    assert row["detail"] == {"to": 1, "from": 2, "version": 3, "change": "changed"}
    # Rolled back to what it is already: no new version.
    assert version_service.rollback_schedule(app, "payroll", 3)["version"] == 3


def test_versions_refuse_hostile_arguments_naming_them(app: ChordbeatCelery) -> None:
    service.apply_schedule(app, {"name": "target", "every": 60, "steps": [step("s")]})
    for bad in (0, -1, True, float("nan"), 1.0, 2**63, "1", None):
        with pytest.raises(InvalidArgument, match=r"^version: "):
            version_service.get_version(app, "target", bad)
        with pytest.raises(InvalidArgument, match=r"^version: "):
            version_service.rollback_schedule(app, "target", bad)
        with pytest.raises(InvalidArgument, match=r"^b: "):
            version_service.diff_versions(app, "target", 1, bad)
    with pytest.raises(InvalidArgument, match=r"^before: "):
        version_service.list_versions(app, "target", before=0)
    with pytest.raises(InvalidArgument, match=r"^limit: "):
        version_service.list_versions(app, "target", limit=10**6)
    with pytest.raises(NotFound, match="schedule 'target' has no version 2"):
        version_service.diff_versions(app, "target", 1, 2)
    with pytest.raises(NotFound, match="schedule 'nobody' does not exist"):
        version_service.list_versions(app, "nobody")
    assert [v["version"] for v in version_service.list_versions(app, "target")] == [1]


def test_a_versions_env_values_are_hidden_as_the_schedule_object_hides_them(app: ChordbeatCelery) -> None:
    service.apply_schedule(app, {"name": "exported", "every": 60, "steps": [step("s")]})

    def executable(token: str, **more: str) -> dict[str, Any]:
        return {"name": "export", "kind": "executable", "argv": ["/bin/true"], "env": {"TOKEN": token, **more}}

    # Stored as an apply of executable steps stores them (enabling them takes a worker's settings).
    with transaction(app.settings.database_url) as session:
        schedule = session.scalars(select(Schedule).where(Schedule.name == "exported")).one()
        for version, token in ((2, "s3cret"), (3, "0ther")):
            schedule.version = version
            steps = [executable(token, **({"MODE": "x"} if version == 3 else {}))]
            record_version(
                session, schedule, {"name": "exported", "steps": steps}, VersionOrigin.of(BEAT), now=utcnow()
            )
    shown = json.dumps(
        [version_service.get_version(app, "exported", 2), version_service.diff_versions(app, "exported", 1, 3)]
    )
    assert "s3cret" not in shown and "0ther" not in shown
    assert version_service.diff_versions(app, "exported", 2, 3) == [
        {"path": "steps[export].env.TOKEN", "op": "changed", "old": "<hidden>", "new": "<hidden>"},
        {"path": "steps[export].env.MODE", "op": "added", "old": None, "new": "<hidden>"},
    ]


@pytest.mark.both_databases
def test_a_version_costs_a_changing_apply_one_statement_and_an_unchanged_one_none(app: ChordbeatCelery) -> None:
    definition = {"name": "counted", "every": 60, "steps": [step("a"), step("b")]}
    service.apply_schedule(app, definition)

    def apply(changed: dict[str, Any]) -> list[str]:
        with recorded_statements(app, words=3) as statements:
            service.apply_schedule(app, changed)
        return [s for s in statements if "schedule_versions" in s]

    assert apply({**definition, "every": 120}) == ["INSERT INTO schedule_versions"]
    assert apply({**definition, "every": 120}) == []


@pytest.mark.both_databases
def test_housekeeping_keeps_the_newest_versions_and_those_kept_runs_ran(app: ChordbeatCelery) -> None:
    service.apply_schedule(app, {"name": "busy", "every": 60, "steps": [step("s")]})
    kept_newest = housekeeping.KEPT_VERSIONS
    current = kept_newest + 5
    now = utcnow()
    old = now - timedelta(days=app.settings.audit_retention_days + 1)
    with transaction(app.settings.database_url) as session:
        schedule = session.scalars(select(Schedule).where(Schedule.name == "busy")).one()
        schedule.version = current
        rows = [
            # 1 to 10 past the trail's retention (6 to 10 among the newest kept_newest), the rest recent.
            {**_version_row(schedule.id, n), "at": old if n <= 10 else now}
            for n in range(2, current + 1)
        ]
        session.execute(insert(SCHEDULE_VERSIONS), rows)
        session.execute(update(ScheduleVersion).where(ScheduleVersion.version == 1).values(at=old))
    # A kept run of version 2: its version stays.
    ran = runs_of(app, "busy", 1)[0]
    with transaction(app.settings.database_url) as session:
        session.execute(update(ScheduleExecution).where(ScheduleExecution.id == ran).values(version=2))

    report = housekeeping.purge(app, now=now, batch=2)
    assert report.versions == 4 and report.as_json()["versions"] == 4
    left = [v.version for v in stored_versions(app, "busy")]
    assert left == [2, *range(6, current + 1)]
    assert housekeeping.purge(app, now=now).versions == 0


def _version_row(schedule_id: int, version: int) -> dict[str, Any]:
    text = canonical_json({"name": "busy", "every": version})
    return {
        "schedule_id": schedule_id,
        "schedule_name": "busy",
        "version": version,
        "definition": text,
        "hash": definition_hash(text),
        "actor": "t",
        "source": "service",
    }


def runs_of(app: ChordbeatCelery, name: str, count: int) -> list[int]:
    ids = []
    for _ in range(count):
        started, _effects = start_and_hold(app, name)
        service.cancel_execution(app, started)
        ids.append(started)
    return ids


@pytest.mark.both_databases
def test_a_deleted_schedules_versions_stay_while_its_kept_runs_ran_them(app: ChordbeatCelery) -> None:
    service.apply_schedule(app, {"name": "gone", "every": 60, "steps": [step("s")]})
    service.apply_schedule(app, {"name": "gone", "every": 120, "steps": [step("s")]})
    ran = runs_of(app, "gone", 1)[0]  # of version 2
    service.delete_schedule(app, "gone")
    with transaction(app.settings.database_url) as session:
        old = utcnow() - timedelta(days=app.settings.audit_retention_days + 1)
        session.execute(update(ScheduleVersion).values(at=old))

    def left() -> list[tuple[int | None, int]]:
        with transaction(app.settings.database_url, read_only=True) as session:
            rows = session.execute(select(ScheduleVersion.schedule_id, ScheduleVersion.version)).all()
        return sorted((schedule_id, version) for schedule_id, version in rows)

    assert left() == [(None, 1), (None, 2)]
    # Past the trail's retention: version 1 goes, version 2 stays while its run is kept.
    assert housekeeping.purge(app).versions == 1
    assert left() == [(None, 2)]
    with transaction(app.settings.database_url) as session:
        session.execute(update(ScheduleExecution).where(ScheduleExecution.id == ran).values(version=None))
    assert housekeeping.purge(app).versions == 1 and left() == []


@pytest.mark.both_databases
def test_a_backfill_runs_the_version_it_names_else_the_current_one(app: ChordbeatCelery) -> None:
    def definition(last: str) -> dict[str, Any]:
        return {"name": "filled", "cron": "0 * * * *", "overlap": "allow", "steps": [step("first"), step(last)]}

    service.apply_schedule(app, definition("old-last"))
    service.apply_schedule(app, definition("new-last"))
    now = utcnow()
    earlier, since, until = ((now - timedelta(hours=h)).isoformat() for h in (6, 3, 0))
    assert backfill_schedule(app, "filled", earlier, since, mode="all", max_concurrent=2, version=1)["backfill_id"]
    assert backfill_schedule(app, "filled", since, until, mode="all", max_concurrent=2)["backfill_id"]
    for version, last in ((1, "old-last"), (2, "new-last")):
        runs = [e for e in service.list_executions(app, "filled", version=version) if e["trigger"] == "backfill"]
        assert runs, version
        assert {tuple(map(tuple, service.get_execution(app, e["id"])["groups"])) for e in runs} == {
            (("first",), (last,))
        }
    with pytest.raises(NotFound, match="schedule 'filled' has no version 7"):
        backfill_schedule(app, "filled", since, until, mode="all", version=7)
    for bad in (0, True, "1", 1.5):
        with pytest.raises(InvalidArgument, match=r"^version: "):
            backfill_schedule(app, "filled", since, until, mode="all", dry_run=True, version=bad)


def test_the_limits_a_definition_uses_are_versioned_with_it(app: ChordbeatCelery) -> None:
    limit_service.apply_limit(app, {"name": "erp", "slots": 2})
    plain = {"name": "limited", "every": 60, "steps": [step("load")]}
    service.apply_schedule(app, plain)
    service.apply_schedule(app, {**plain, "steps": [{**step("load"), "uses": [{"limit": "erp", "slots": 2}]}]})
    assert version_service.diff_versions(app, "limited", 1, 2) == [
        {"path": "steps[load].uses", "op": "added", "old": None, "new": [{"limit": "erp", "slots": 2}]}
    ]
    rolled = version_service.rollback_schedule(app, "limited", 1)
    assert rolled["version"] == 3 and "uses" not in rolled["steps"][0]
