"""A schedule file's ``limits:``: applied before its schedules in the file's transaction, audited,
shown by a dry run, pruned with the file's own source only and never while held, every mistake
refused at once naming the field, and nothing half-written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from sqlalchemy import select

from celeryapp.application import ChordbeatCelery
from celeryapp.errors import DefinitionError
from celeryapp.execution.limit_slots import Demand, Holder, acquire_or_wait, release
from celeryapp.interfaces import limit_service, service
from celeryapp.interfaces.cli import main
from celeryapp.scheduling.schedule_file import apply_file, read_file
from celeryapp.states import AuditSource
from models import Schedule, transaction
from models.audit import Actor
from models.limit_tables import LIMITS
from tests.support.helpers import step

pytestmark = pytest.mark.both_databases


def write(path: Path, limits: list[dict[str, Any]], *schedules: dict[str, Any], source: str | None = None) -> Path:
    document: dict[str, Any] = {"limits": limits, "schedules": list(schedules)}
    if source is not None:
        document["source"] = source
    path.write_text(yaml.safe_dump(document))
    return path


def stored(app: ChordbeatCelery) -> dict[str, tuple[int, str | None]]:
    with transaction(app.settings.database_url, read_only=True) as session:
        return {row.name: (row.slots, row.source_name) for row in session.execute(select(LIMITS))}


def schedules(app: ChordbeatCelery) -> set[str]:
    with transaction(app.settings.database_url, read_only=True) as session:
        return set(session.scalars(select(Schedule.name)))


def hold(app: ChordbeatCelery, limit: str) -> Holder:
    who = Holder(worker_task_id=7, attempt=1, execution_id=70, step_name="load")
    with transaction(app.settings.database_url) as session:
        assert acquire_or_wait(session, [Demand(limit)], who)[0]
    return who


def test_a_files_limits_are_applied_audited_dry_run_and_pruned_never_while_held(
    app: ChordbeatCelery, tmp_path: Path
) -> None:
    limits = [{"name": "warehouse", "slots": 3, "rate": "60/min"}, {"name": "erp", "slots": 1}]
    path = write(tmp_path / "ops.yaml", limits, {"name": "load", "every": 60, "steps": [step("s")]})
    limit_service.apply_limit(app, {"name": "erp", "slots": 5}, actor="bob")  # made through the service

    dry = apply_file(app, path, dry_run=True)
    assert (dry.limits["added"], dry.limits["changed"], dry.limits["taken_over"]) == (["warehouse"], ["erp"], ["erp"])
    assert stored(app) == {"erp": (5, None)} and schedules(app) == set(), "a dry run writes nothing"

    diff = apply_file(app, path, actor=Actor("alice", AuditSource.CLI), reason="one warehouse")
    assert diff.limits["added"] == ["warehouse"] and diff.limits["changed"] == ["erp"] and diff.added == ["load"]
    assert stored(app) == {"erp": (1, "ops"), "warehouse": (3, "ops")}
    rows = [r for r in service.list_audit(app) if r["actor"] == "alice"]
    assert sorted((r["action"], r["detail"].get("limit")) for r in rows) == [
        ("file_applied", None),
        ("limit_applied", "erp"),
        ("limit_applied", "warehouse"),
    ]
    applied = next(r for r in rows if r["detail"].get("limit") == "warehouse")
    assert (applied["source"], applied["reason"], applied["detail"]["source"]) == ("cli", "one warehouse", "ops")
    assert applied["detail"]["definition"]["rate"] == "60/min"
    assert apply_file(app, path).empty, "the same file again changes nothing"

    # The file drops "erp" while a step holds it, and changes its schedule: refused whole.
    who = hold(app, "erp")
    smaller = write(tmp_path / "ops.yaml", limits[:1], {"name": "load", "every": 90, "steps": [step("s")]})
    for dry_run in (True, False):
        with pytest.raises(DefinitionError) as caught:
            apply_file(app, smaller, dry_run=dry_run)
        assert caught.value.field == "limits" and "'erp' (1 slots in use), still held" in str(caught.value)
    assert "erp" in stored(app)
    assert service.get_schedule(app, "load")["every"] == 60, "nothing half-written"

    # Released, it goes; a limit of the API or of another source is never pruned.
    with transaction(app.settings.database_url) as session:
        release(session, who.worker_task_id, who.attempt)
    limit_service.apply_limit(app, {"name": "api-made", "slots": 2})
    other = write(tmp_path / "other.yaml", [{"name": "theirs", "slots": 2}])
    apply_file(app, other)
    diff = apply_file(app, smaller, remove_limits=[])
    assert diff.limits["kept"] == ["erp"] and "erp" in stored(app), "an unconfirmed removal keeps the limit"
    diff = apply_file(app, smaller)
    assert diff.limits["removed"] == ["erp"]
    assert stored(app) == {"api-made": (2, None), "theirs": (2, "other"), "warehouse": (3, "ops")}


@pytest.mark.parametrize(
    ("limit", "field", "reason"),
    [
        ({"name": "w", "slots": 0}, "limits[0] (w).slots", "must be between 1 and 10000"),
        ({"name": "w", "slots": -3}, "limits[0] (w).slots", "must be between 1 and 10000"),
        ({"name": "w", "slots": float("nan")}, "limits[0] (w).slots", "must be an integer"),
        ({"name": "w", "slots": True}, "limits[0] (w).slots", "boolean"),
        ({"name": "w", "slots": 10**12}, "limits[0] (w).slots", "must be between 1 and 10000"),
        ({"name": "w"}, "limits[0] (w).slots", "is required"),
        ({"name": "w\u0430rehouse", "slots": 1}, "limits[0].name", "ASCII"),
        ({"name": "w", "slots": 1, "rate": "many"}, "limits[0] (w).rate", "N/period"),
        ({"name": "w", "slots": 1, "shots": 2}, "limits[0] (w).shots", ""),
    ],
)
def test_a_bad_limit_is_refused_naming_its_field(
    tmp_path: Path, limit: dict[str, Any], field: str, reason: str
) -> None:
    path = write(tmp_path / "f.yaml", [limit])
    with pytest.raises(DefinitionError) as caught:
        read_file(path, rules=None)
    assert caught.value.field == field and reason in caught.value.reason, str(caught.value)


def test_every_mistake_of_limits_and_schedules_is_reported_at_once(tmp_path: Path) -> None:
    path = write(
        tmp_path / "f.yaml",
        [{"name": "warehouse", "slots": 2}, {"name": "Warehouse", "slots": 2}, {"name": "warehouse", "slots": 0}],
        {"name": "s", "every": -1, "steps": [step("s")]},
    )
    with pytest.raises(DefinitionError) as caught:
        read_file(path, rules=None)
    assert [str(error) for error in caught.value.errors] == [
        "limits[1] (Warehouse).name: limit 'Warehouse' differs from 'warehouse' only in case (limits[0])",
        "limits[2] (warehouse).slots: must be between 1 and 10000, got 0",
        "schedules[0] (s).every: " + caught.value.errors[-1].reason,
    ]
    (tmp_path / "g.yaml").write_text("limits: {warehouse: 3}\n")
    with pytest.raises(DefinitionError, match=r"^limits: must be a list of limit definitions, got object"):
        read_file(tmp_path / "g.yaml", rules=None)


def test_a_bad_limit_refuses_the_whole_file(app: ChordbeatCelery, tmp_path: Path) -> None:
    path = write(
        tmp_path / "f.yaml",
        [{"name": "good", "slots": 2}, {"name": "bad", "slots": 0}],
        {"name": "s", "every": 60, "steps": [step("s")]},
    )
    with pytest.raises(DefinitionError, match=r"limits\[1\] \(bad\).slots"):
        apply_file(app, path)
    assert stored(app) == {} and schedules(app) == set()


def test_cli_apply_shows_limit_changes_and_asks_before_removing_one(app: ChordbeatCelery, tmp_path: Path) -> None:
    path = write(tmp_path / "ops.yaml", [{"name": "warehouse", "slots": 3}, {"name": "erp", "slots": 1}])
    runner = CliRunner()
    dry = runner.invoke(main, ["apply", "--dry-run", str(path)])
    assert dry.exit_code == 0, dry.output
    assert "+ limit warehouse" in dry.output and "limits added warehouse, erp" in dry.output and stored(app) == {}
    assert runner.invoke(main, ["apply", str(path)]).exit_code == 0
    write(tmp_path / "ops.yaml", [{"name": "warehouse", "slots": 3}])
    refused = runner.invoke(main, ["apply", str(path)], input="n\n")
    assert refused.exit_code == 1 and "remove 1 limit(s) of source ops" in refused.output
    assert "needs confirmation" in refused.output and "erp" in stored(app)
    agreed = runner.invoke(main, ["apply", str(path)], input="y\n")
    assert agreed.exit_code == 0 and "- limit erp" in agreed.output and "erp" not in stored(app)


def test_a_file_may_use_the_limits_it_defines_dry_run_too(app: ChordbeatCelery, tmp_path: Path) -> None:
    """A schedule's ``uses`` is checked against the limits the same file defines, as well as those
    stored: the file's own limits are written first in its transaction, and a dry run counts them
    without writing them. A use of a limit neither defines still refuses the whole file."""
    uses = {"name": "load", "every": 60, "uses": ["warehouse"], "steps": [{**step("s"), "uses": [{"limit": "erp"}]}]}
    path = write(tmp_path / "ops.yaml", [{"name": "warehouse", "slots": 3}, {"name": "erp", "slots": 1}], uses)
    dry = apply_file(app, path, dry_run=True)
    assert dry.added == ["load"] and stored(app) == {}
    assert apply_file(app, path).added == ["load"]
    assert stored(app) == {"erp": (1, "ops"), "warehouse": (3, "ops")}
    path = write(tmp_path / "ops.yaml", [{"name": "warehouse", "slots": 3}], {**uses, "name": "other"})
    with pytest.raises(DefinitionError, match=r"uses"):
        apply_file(app, path, dry_run=True)
