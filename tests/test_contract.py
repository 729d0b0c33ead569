"""The contract cannot drift: the registered service tasks, the client, the service functions and
the docs tables all agree with their one source (celeryapp.contract, celeryapp.variables)."""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import tasks.service
from celeryapp import app, variables
from celeryapp.client import ChordbeatClient
from celeryapp.contract import SERVICE_TASKS, Param, ServiceTask
from celeryapp.interfaces import (
    alerts,
    backfill_service,
    docs_tables,
    limit_service,
    next_fires,
    service,
    version_service,
    wiring_checks,
)

ROOT = Path(__file__).resolve().parent.parent
REQUIRED = inspect.Parameter.empty


def params_of(function: Callable[..., Any], skip: int = 0) -> list[tuple[str, Any]]:
    """Its positional-or-keyword parameters (keyword-only ones are for chordbeat's own callers)."""
    parameters = list(inspect.signature(function).parameters.values())[skip:]
    return [(p.name, p.default) for p in parameters if p.kind is not inspect.Parameter.KEYWORD_ONLY]


def expected(task: ServiceTask) -> list[tuple[str, Any]]:
    return [(p.name, REQUIRED if p.required else p.default) for p in task.params]


def short(task: ServiceTask) -> str:
    return task.name.removeprefix("chordbeat.")


def test_the_registered_service_tasks_are_those_of_the_contract_with_its_arguments() -> None:
    registered = {name: task for name, task in app.tasks.items() if isinstance(task, tasks.service.ServiceTask)}
    assert sorted(registered) == sorted(t.name for t in SERVICE_TASKS)
    for task in SERVICE_TASKS:
        assert params_of(registered[task.name].run) == expected(task), task.name


#: The modules whose functions the service tasks call, each defining its own.
SERVICE_MODULES = (service, backfill_service, alerts, next_fires, wiring_checks, limit_service, version_service)


def test_the_service_functions_take_the_contracts_arguments_after_the_app() -> None:
    for task in SERVICE_TASKS:
        homes = [m for m in SERVICE_MODULES if getattr(getattr(m, short(task), None), "__module__", None) == m.__name__]
        assert len(homes) == 1, f"{task.name}: defined in {[m.__name__ for m in homes]}"
        assert params_of(getattr(homes[0], short(task)), skip=1) == expected(task), task.name


def test_the_client_has_one_method_per_service_task_with_its_arguments() -> None:
    methods = {
        name
        for name, value in vars(ChordbeatClient).items()
        if inspect.isfunction(value) and not name.startswith("_") and name not in {"call", "close", "worker_listening"}
    }
    assert methods == {short(t) for t in SERVICE_TASKS}
    for task in SERVICE_TASKS:
        assert params_of(getattr(ChordbeatClient, short(task)), skip=1) == expected(task), task.name


def test_every_refusal_a_task_documents_is_a_documented_error() -> None:
    from celeryapp.contract import CALLER_ERRORS

    documented = {e.exc_type for e in CALLER_ERRORS}
    for task in SERVICE_TASKS:
        assert set(task.errors) <= documented, task.name


def test_the_docs_tables_are_generated_from_their_source() -> None:
    diff = docs_tables.stale()
    assert not diff, f"stale generated tables: run `python -m celeryapp.interfaces.docs_tables`\n{diff}"


def test_a_stale_table_is_reported_with_a_diff(tmp_path: Path) -> None:
    for name in docs_tables.FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        text = (ROOT / name).read_text()
        (tmp_path / name).write_text(text.replace("| `CHORDBEAT_BROKER_URL` |", "| `CHORDBEAT_BROKER` |", 1))
    diff = docs_tables.stale(tmp_path)
    assert "-| `CHORDBEAT_BROKER` |" in diff and "+| `CHORDBEAT_BROKER_URL` |" in diff


def test_a_parameter_renders_as_the_table_shows_it() -> None:
    assert docs_tables._param(Param("limit", required=False, default=50, note="at most 1000")) == (
        "`limit` (default 50, at most 1000)"
    )
    assert docs_tables._param(Param("payload", required=False)) == "`payload` (optional)"


# --- CHORDBEAT_* variables --------------------------------------------------------------------------

NAMES = re.compile(r"CHORDBEAT_[A-Z0-9_]+")
KNOWN = {v.name for v in variables.VARIABLES}
#: The test suite's own knobs (chaos seeds, outage lengths) and what the lab's clock-shift library
#: reads: not chordbeat's configuration, but docs/ may say how to run the suite and bench/ may
#: shift a server's clock as the lab does.
LAB_READS = {
    name
    for file in [*(ROOT / "tests").rglob("*.py"), ROOT / "tests" / "support" / "clock_shift.c"]
    for name in re.findall(r'(?:environ\.get|getenv)\("(CHORDBEAT_[A-Z0-9_]+)"', file.read_text())
} - KNOWN


def test_the_settings_read_exactly_the_variables_documented_as_settings() -> None:
    tree = ast.parse((ROOT / "celeryapp" / "config.py").read_text())
    read = set()
    for function in ast.walk(tree):
        if isinstance(function, ast.FunctionDef):
            for node in ast.walk(function):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    read |= set(NAMES.findall(node.value))
    assert read == set(variables.OWN_VARIABLES)


@pytest.mark.parametrize("folder", ["deploy", "Makefile", "bench", "examples", "flower.cfg"])
def test_the_deploy_files_use_only_documented_variables(folder: str) -> None:
    path = ROOT / folder
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    used = {name for file in files for name in NAMES.findall(file.read_text(errors="replace"))}
    assert used <= KNOWN | LAB_READS, used - KNOWN - LAB_READS


def test_the_docs_mention_only_documented_variables_with_their_documented_defaults() -> None:
    defaults = {v.name: v.default for v in variables.VARIABLES}
    for file in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        text = file.read_text()
        for name in set(NAMES.findall(text)) - KNOWN - LAB_READS:
            # Examples of the variables sql steps read, and a setting documented as absent on purpose.
            assert name.startswith(variables.DEFAULT_SQL_ENV_PREFIX) or name == "CHORDBEAT_EXECUTABLE_USER", (
                file,
                name,
            )
        for row in re.finditer(r"^\| `(CHORDBEAT_[A-Z_]+)` \| ([^|]*) \|", text, re.M):
            assert row[2].strip() == defaults[row[1]], (file.name, row[1])
