"""Executable and SQL steps: success, failure, timeout; their definition fields validated."""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celeryapp.app import ChordbeatCelery
from celeryapp.definition import parse_definition
from celeryapp.errors import DefinitionError
from celeryapp.step_kinds import split_statements
from tests.conftest import call, wait_for
from tests.test_lifecycle import finished

PY = sys.executable


def run(client: Celery, *steps: dict[str, Any]) -> dict[str, Any]:
    call(client, "chordbeat.apply_schedule", definition={"name": "kinds", "every": 60, "steps": list(steps)})
    return finished(client, call(client, "chordbeat.trigger_schedule", name="kinds")["execution_id"])


def test_executable_steps_keep_their_output_and_fail_on_a_nonzero_exit(
    app: ChordbeatCelery, worker: Any, client: Celery, tmp_path: Path
) -> None:
    ok = {
        "name": "hello",
        "kind": "executable",
        "argv": [PY, "-c", "import os; print('hi', os.environ['WHO'])"],
        "env": {"WHO": "ops"},
        "cwd": str(tmp_path),
    }
    done = run(client, ok)
    assert done["status"] == "completed"
    assert "'output': 'hi ops\\n'" in done["activities"][0]["message"]
    # env values stay on the workers: the schedule object shows their names only.
    assert call(client, "chordbeat.get_schedule", name="kinds")["steps"] == [{**ok, "env": {"WHO": "<hidden>"}}]

    script = "import sys; print('working', flush=True); print('broken pipe', file=sys.stderr); sys.exit(3)"
    failed = run(client, {"name": "bad", "kind": "executable", "argv": [PY, "-c", script]})
    assert failed["status"] == "failed"
    assert failed["error"] == "step 'bad' failed: StepError: exit code 3: working\nbroken pipe\n"
    missing = run(client, {"name": "nope", "kind": "executable", "argv": ["/no/such/program"]})
    assert "cannot start '/no/such/program'" in missing["error"]


def test_executable_steps_time_out_and_leave_nothing_running(
    app: ChordbeatCelery, worker: Any, client: Celery, tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    # A shell that starts a grandchild: the whole process group must go, not just the shell.
    script = f"sleep 30 & echo $$ $! > {pids}; wait"
    done = run(client, {"name": "slow", "kind": "executable", "argv": ["sh", "-c", script], "timeout": 0.5})
    assert done["status"] == "failed"
    assert "timed out after 0.5s" in done["error"]
    for pid in map(int, pids.read_text().split()):
        wait_for(lambda pid=pid: not alive(pid), 5, what=f"process {pid} to be gone")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead too: it only waits for its parent to read its status.
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_sql_steps_run_in_one_transaction_against_a_url_from_the_environment(
    app: ChordbeatCelery, worker: Any, client: Celery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "reporting.db"
    monkeypatch.setenv("REPORTING_DB", f"sqlite:///{target}")
    script = "CREATE TABLE totals (n integer);\nINSERT INTO totals VALUES (1);\nINSERT INTO totals VALUES ('a;b');"
    done = run(client, {"name": "sql", "kind": "sql", "script": script, "database_env": "REPORTING_DB"})
    assert done["status"] == "completed", done["error"]
    assert done["activities"][0]["message"] == "3 statements, 2 rows affected"
    assert sqlite3.connect(target).execute("select count(*) from totals").fetchone() == (2,)

    broken = "CREATE TABLE half (n integer);\nINSERT INTO missing VALUES (1);"
    failed = run(client, {"name": "sql", "kind": "sql", "script": broken, "database_env": "REPORTING_DB"})
    assert failed["status"] == "failed" and "no such table: missing" in failed["error"]
    tables = {r[0] for r in sqlite3.connect(target).execute("select name from sqlite_master")}
    assert tables == {"totals"}, "the failed script must leave nothing behind"

    unset = run(client, {"name": "sql", "kind": "sql", "script": "select 1", "database_env": "NOT_SET_ANYWHERE"})
    assert unset["error"].endswith("database_env: the variable NOT_SET_ANYWHERE is not set on this worker")


@pytest.mark.parametrize(
    ("step", "field", "reason"),
    [
        ({"kind": "executable"}, "steps[0].argv", "non-empty list of strings"),
        ({"kind": "executable", "argv": ["x"], "task": "t"}, "steps[0].task", "unknown field"),
        ({"kind": "executable", "argv": ["x"], "env": {"A": 1}}, "steps[0].env", "string values"),
        ({"kind": "sql", "script": "select 1"}, "steps[0].database_env", "is required"),
        (
            {"kind": "sql", "script": "select 1", "database_env": "postgres://u:p@h/db"},
            "steps[0].database_env",
            "must name an environment variable",
        ),
        ({"kind": "sql", "database_env": "DB"}, "steps[0].script", "is required"),
        ({"kind": "shell", "argv": ["x"]}, "steps[0].kind", "must be one of task, executable, sql"),
        ({"task": "chordbeat.steps.sql"}, "steps[0].task", 'use "kind": "sql"'),
    ],
)
def test_step_kind_fields_are_validated(step: dict[str, Any], field: str, reason: str) -> None:
    with pytest.raises(DefinitionError) as caught:
        parse_definition({"name": "k", "every": 1, "steps": [{"name": "s", **step}]})
    assert caught.value.field == field and reason in caught.value.reason


def test_statements_split_at_their_ends_only() -> None:
    script = "insert into t values ('a;b');\n-- comment\nupdate t set x = 1\n where y = 2;\nselect 1"
    assert split_statements(script) == [
        "insert into t values ('a;b');",
        "-- comment\nupdate t set x = 1\n where y = 2;",
        "select 1",
    ]


def test_step_kinds_can_be_switched_off(app: ChordbeatCelery, worker: Any, client: Celery) -> None:
    from dataclasses import replace

    app.apply_settings(replace(app.settings, step_kinds=frozenset({"task"})))
    with pytest.raises(Exception, match=r"steps\[0\]\.kind: executable steps are not enabled on the workers"):
        call(
            client,
            "chordbeat.apply_schedule",
            definition={"name": "x", "every": 60, "steps": [{"name": "s", "kind": "executable", "argv": ["true"]}]},
        )
