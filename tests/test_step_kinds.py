"""Executable and SQL steps: success, failure, timeout, the operator's policy, and what a broker caller
cannot make them do."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from sqlalchemy import create_engine, text, update

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.domain.validation import parse_definition
from celeryapp.errors import DefinitionError, StepError
from celeryapp.monitoring import worker_registry
from celeryapp.variables import STEP_KINDS
from celeryapp.worker.step_kinds import run_executable, split_statements
from models import ScheduleStep, transaction
from tests.support import processes
from tests.support.helpers import call, finished, wait_for
from tests.support.servers import PostgresServer

pytestmark = pytest.mark.both_databases

PY = sys.executable
SH = "/bin/sh"
ENV = "/usr/bin/env"
#: What the tests allow: enough to run their programs, nothing else.
ALLOW = (PY, SH, ENV)

Enable = Callable[..., ChordbeatCelery]


@pytest.fixture
def enable(app: ChordbeatCelery) -> Enable:
    """Turn executable and sql steps on in this process's settings (the in-process worker's too)."""

    def apply(**changes: Any) -> ChordbeatCelery:
        defaults: dict[str, Any] = {"step_kinds": STEP_KINDS, "executable_allow": ALLOW}
        app.apply_settings(replace(app.settings, **{**defaults, **changes}))
        # The in-process worker published its step policy when it was ready; it runs under these
        # settings now, so it says so again (a worker's settings never change while it runs).
        client = redis.Redis.from_url(app.settings.broker_url)
        for entry in worker_registry.live_workers(client):
            worker_registry.publish(
                client, entry.node, entry.queues, entry.tasks, app.settings, ttl_s=worker_registry.REGISTRY_TTL_S
            )
        return app

    return apply


def run(client: Celery, *steps: dict[str, Any], name: str = "kinds") -> dict[str, Any]:
    apply(client, *steps, name=name)
    return finished(client, call(client, "chordbeat.trigger_schedule", name=name)["execution_id"])


def apply(client: Celery, *steps: dict[str, Any], name: str = "kinds") -> dict[str, Any]:
    result: dict[str, Any] = call(
        client, "chordbeat.apply_schedule", definition={"name": name, "every": 3600, "steps": list(steps)}
    )
    return result


def refused(client: Celery, *steps: dict[str, Any]) -> str:
    """The error ``apply_schedule`` answers with; nothing may be stored."""
    with pytest.raises(Exception) as caught:
        apply(client, *steps, name="refused")
    with pytest.raises(Exception, match="does not exist"):
        call(client, "chordbeat.get_schedule", name="refused")
    return str(caught.value)


def test_executable_steps_keep_their_output_and_fail_on_a_nonzero_exit(
    enable: Enable, worker: Any, client: Celery, tmp_path: Path
) -> None:
    enable(executable_allow=(*ALLOW, f"{tmp_path}/bin/"))
    ok = {
        "name": "hello",
        "kind": "executable",
        "argv": [PY, "-c", "import os; print('hi', os.environ['WHO'])"],
        "env": {"WHO": "ops"},
        "cwd": str(tmp_path),
    }
    done = run(client, ok)
    assert done["status"] == "completed"
    assert '"output": "hi ops\\n"' in done["activities"][0]["message"]  # as JSON
    # env values stay on the workers: the schedule object shows their names only.
    assert call(client, "chordbeat.get_schedule", name="kinds")["steps"] == [{**ok, "env": {"WHO": "<hidden>"}}]

    script = "import sys; print('working', flush=True); print('broken pipe', file=sys.stderr); sys.exit(3)"
    failed = run(client, {"name": "bad", "kind": "executable", "argv": [PY, "-c", script]})
    assert failed["status"] == "failed"
    assert failed["error"] == "step 'bad' failed: StepError: exit code 3: working\nbroken pipe\n"
    missing = run(client, {"name": "nope", "kind": "executable", "argv": [f"{tmp_path}/bin/missing"]})
    assert f"cannot start '{tmp_path}/bin/missing': no such file" in missing["error"]
    raw = "import sys; sys.stdout.buffer.write(bytes([104, 255, 10]))"
    binary = run(client, {"name": "bytes", "kind": "executable", "argv": [PY, "-c", raw]})
    assert binary["status"] == "completed", "output that is not UTF-8 is kept, not a crash"
    assert '"output": "h\ufffd\\n"' in binary["activities"][0]["message"]


def test_executable_steps_time_out_and_leave_nothing_running(
    enable: Enable, worker: Any, client: Celery, tmp_path: Path
) -> None:
    enable()
    pids = tmp_path / "pids"
    # A shell that starts a grandchild: the whole process group must go, not just the shell.
    script = f"sleep 30 & echo $$ $! > {pids}; wait"
    done = run(client, {"name": "slow", "kind": "executable", "argv": [SH, "-c", script], "timeout": 0.5})
    assert done["status"] == "failed"
    assert "timed out after 0.5s" in done["error"]
    for pid in map(int, pids.read_text().split()):
        wait_for(lambda pid=pid: not alive(pid), 5, what=f"process {pid} to be gone")


def test_what_a_program_leaves_running_ends_with_it(
    enable: Enable, worker: Any, client: Celery, tmp_path: Path
) -> None:
    enable()
    pids = tmp_path / "pids"
    script = f"sleep 300 > /dev/null 2>&1 & echo $! > {pids}"
    done = run(client, {"name": "leaves", "kind": "executable", "argv": [SH, "-c", script]})
    assert done["status"] == "completed", done["error"]
    pid = int(pids.read_text())
    wait_for(lambda: not alive(pid), 5, what=f"the background process {pid} to be gone")


def test_a_cancelled_program_stops_at_once_without_a_timeout(
    enable: Enable, worker: Any, client: Celery, tmp_path: Path
) -> None:
    enable()
    pids = tmp_path / "pids"
    apply(client, {"name": "forever", "kind": "executable", "argv": [SH, "-c", f"echo $$ > {pids}; sleep 300"]})
    execution_id = call(client, "chordbeat.trigger_schedule", name="kinds")["execution_id"]
    wait_for(lambda: pids.exists() and pids.read_text().strip(), 20, what="the program to start")
    call(client, "chordbeat.cancel_execution", execution_id=execution_id)
    done = finished(client, execution_id, timeout=15)
    assert done["status"] == "cancelled"
    pid = int(pids.read_text())
    wait_for(lambda: not alive(pid), 5, what=f"process {pid} to be gone")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead too: it only waits for its parent to read its status.
    return stat_fields(pid)[0] != "Z"


def stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat from the state on: state, ppid, pgrp, ... (the name may hold spaces)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = stat_fields(int(entry.name))
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def test_the_program_gets_none_of_the_workers_environment(
    enable: Enable, worker: Any, client: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a real worker holds in its environment; a program must not be handed any of it.
    monkeypatch.setenv("CHORDBEAT_DATABASE_URL", "postgresql://chordbeat:db-secret@db/chordbeat")
    monkeypatch.setenv("FLOWER_BASIC_AUTH", "admin:flower-secret")
    enable()
    done = run(client, {"name": "env", "kind": "executable", "argv": [ENV], "env": {"MODE": "nightly"}})
    assert done["status"] == "completed", done["error"]
    output = done["activities"][0]["message"]
    names = {line.split("=", 1)[0] for line in json.loads(output)["output"].splitlines()}
    assert names == {"PATH", "LANG", "MODE"}
    for secret in ("db-secret", "flower-secret", os.environ.get("HOME", "/root")):
        assert secret not in output


def test_programs_outside_the_allowlist_are_refused_at_validation(
    enable: Enable, worker: Any, client: Celery, tmp_path: Path
) -> None:
    hr = tmp_path / "opt" / "hr"
    hr.mkdir(parents=True)
    (hr / "shell").symlink_to(SH)
    enable(executable_allow=(f"{hr}/",))
    ok = {"name": "ok", "kind": "executable", "argv": [str(hr / "export")]}
    for argv in (
        [PY, "-c", "print(1)"],
        [f"{hr}/../../../../../bin/sh", "-c", "id"],
        [str(hr / "shell"), "-c", "id"],
    ):
        error = refused(client, [ok, {"name": "x", "kind": "executable", "argv": argv}])
        assert "steps[0][1].argv: the program" in error and "is not in CHORDBEAT_EXECUTABLE_ALLOW" in error
    assert "steps[0].argv: the program 'sh' must be an absolute path" in refused(
        client, {"name": "x", "kind": "executable", "argv": ["sh", "-c", "id"]}
    )


def test_loader_variables_are_refused_at_validation(enable: Enable, worker: Any, client: Celery) -> None:
    enable()
    for name in ("LD_PRELOAD", "PYTHONPATH", "PATH", "BASH_ENV", "NODE_OPTIONS"):
        step = {"name": "x", "kind": "executable", "argv": [ENV], "env": {"MODE": "a", name: "/tmp/evil"}}
        assert f"steps[0].env.{name}: {name} may not be set" in refused(client, step)
    # Proxies, askpass and pager commands, start-up files; in lower case, as curl reads proxies.
    names = ("HTTPS_PROXY", "https_proxy", "all_proxy", "SSH_ASKPASS", "PAGER", "ZDOTDIR")
    step = {"name": "x", "kind": "executable", "argv": [ENV], "env": {"MODE": "a", **dict.fromkeys(names, "x")}}
    error = refused(client, step)
    for name in names:
        assert f"steps[0].env.{name}: {name} may not be set" in error
    # Look-alikes are not names at all: a trailing space, a Cyrillic O, a fullwidth L.
    for name in ("LD_PRELOAD ", "LD_PREL\u041eAD", "\uff2cD_PRELOAD"):
        step = {"name": "x", "kind": "executable", "argv": [ENV], "env": {name: "/tmp/evil.so"}}
        assert f"steps[0].env.{name}: {name!r} is not an environment variable name" in refused(client, step)


def test_kind_steps_are_off_by_default(app: ChordbeatCelery, worker: Any, client: Celery) -> None:
    assert app.settings.step_kinds == {"task"}
    assert "steps[0].kind: executable steps are not enabled on the workers" in refused(
        client, {"name": "s", "kind": "executable", "argv": [ENV]}
    )
    assert "steps[0].kind: sql steps are not enabled on the workers" in refused(
        client, {"name": "s", "kind": "sql", "script": "select 1", "database_env": "CHORDBEAT_SQL_X"}
    )


def test_celery_and_chordbeat_tasks_are_never_steps(enable: Enable, worker: Any, client: Celery) -> None:
    enable()
    starmap = {
        "name": "around",
        "task": "celery.starmap",
        "kwargs": {"task": {"task": "chordbeat.steps.executable", "args": [], "kwargs": {}}, "it": [[[ENV]]]},
    }
    assert "steps[0].task: task 'celery.starmap' is one of Celery's own tasks" in refused(client, starmap)
    for task in ("chordbeat.recover", "chordbeat.apply_schedule", "chordbeat.run_step", "chordbeat.housekeeping"):
        assert f"task {task!r} is one of chordbeat's own tasks" in refused(client, {"name": "x", "task": task})


def test_operators_restrict_step_tasks_by_pattern(enable: Enable, worker: Any, client: Celery) -> None:
    enable(step_tasks=("hr.*", "billing.*"))
    error = refused(client, {"name": "x", "task": "chordbeat.examples.sleep"})
    assert "steps[0].task: task 'chordbeat.examples.sleep' is not allowed as a step here" in error


def test_a_stored_plan_is_checked_again_by_the_worker_that_runs_it(enable: Enable, worker: Any, client: Celery) -> None:
    enable(executable_allow=(SH, ENV))
    apply(client, {"name": "e", "kind": "executable", "argv": [ENV]}, name="program")
    apply(client, {"name": "t", "task": "chordbeat.examples.sleep"}, name="task")
    sql = {"name": "q", "kind": "sql", "script": "select 1", "database_env": "CHORDBEAT_SQL_REPORTING"}
    apply(client, sql, name="sql")
    # Forged in the database (or stored by an older release): a Celery built-in as a step, a
    # loader variable in a program's environment.
    apply(client, {"name": "s", "task": "chordbeat.examples.sleep"}, name="forged")
    apply(client, {"name": "l", "kind": "executable", "argv": [SH, "-c", "true"]}, name="loader")
    app = enable(executable_allow=(SH,), step_tasks=("hr.*",), sql_env_prefix="REPORTS_")
    with transaction(app.settings.database_url) as session:
        session.execute(update(ScheduleStep).where(ScheduleStep.name == "s").values(task="celery.starmap"))
        session.execute(
            update(ScheduleStep)
            .where(ScheduleStep.name == "l")
            .values(kwargs={"argv": [SH, "-c", "true"], "env": {"LD_PRELOAD": "/tmp/evil.so"}})
        )

    def trigger(name: str) -> dict[str, Any]:
        return finished(client, call(client, "chordbeat.trigger_schedule", name=name)["execution_id"])

    program = trigger("program")
    assert program["status"] == "failed"
    assert "is not in CHORDBEAT_EXECUTABLE_ALLOW" in program["error"]
    task = trigger("task")
    assert "refused on this worker: task 'chordbeat.examples.sleep' is not allowed as a step here" in task["error"]
    forged = trigger("forged")
    assert "refused on this worker: task 'celery.starmap' is one of Celery's own tasks" in forged["error"]
    assert "database_env: CHORDBEAT_SQL_REPORTING does not start with REPORTS_" in trigger("sql")["error"]
    assert "env: LD_PRELOAD may not be set" in trigger("loader")["error"]
    enable(step_kinds=frozenset({"task"}))
    off = trigger("program")
    assert "refused on this worker: executable steps are not enabled" in off["error"]


def test_kind_tasks_called_directly_from_the_broker_do_not_run(
    enable: Enable, worker: Any, client: Celery, tmp_path: Path
) -> None:
    enable()
    marker = tmp_path / "ran"
    argv = [SH, "-c", f"touch {marker}"]
    direct = client.send_task("chordbeat.steps.executable", kwargs={"argv": argv})
    with pytest.raises(Exception, match="executable steps run only as a step of an execution"):
        direct.get(timeout=20)
    around = client.send_task(
        "celery.starmap",
        kwargs={"task": {"task": "chordbeat.steps.executable", "args": [], "kwargs": {}}, "it": [[argv]]},
    )
    with pytest.raises(Exception, match="executable steps run only as a step of an execution"):
        around.get(timeout=20)
    assert not marker.exists()


# --- sql ----------------------------------------------------------------------------------------


@pytest.fixture
def target_url(database_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """A database of the same engine as this test's, apart from chordbeat's, for sql steps to write."""
    if database_url.startswith("sqlite"):
        yield f"sqlite:///{tmp_path / 'reporting.db'}"
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    name = f"reporting_{os.getpid()}_{abs(hash(str(tmp_path))) % 10**8}"
    admin = create_engine(server.url(), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    yield server.url(name)
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE {name} WITH (FORCE)"))
    admin.dispose()


def scalar(url: str, query: str) -> Any:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(text(query)).scalar()
    finally:
        engine.dispose()


def test_sql_steps_run_in_one_transaction_against_a_url_from_the_environment(
    enable: Enable, worker: Any, client: Celery, target_url: str
) -> None:
    enable(sql_urls={"CHORDBEAT_SQL_REPORTING": target_url})
    script = (
        "CREATE TABLE totals (n varchar(10));\nINSERT INTO totals VALUES ('1');\nINSERT INTO totals VALUES ('a;b');"
    )
    done = run(client, {"name": "sql", "kind": "sql", "script": script, "database_env": "CHORDBEAT_SQL_REPORTING"})
    assert done["status"] == "completed", done["error"]
    assert done["activities"][0]["message"] == "3 statements, 2 rows affected"
    assert scalar(target_url, "select count(*) from totals") == 2

    broken = "CREATE TABLE half (n integer);\nINSERT INTO missing VALUES (1);"
    failed = run(client, {"name": "sql", "kind": "sql", "script": broken, "database_env": "CHORDBEAT_SQL_REPORTING"})
    assert failed["status"] == "failed" and "missing" in failed["error"]
    assert scalar(target_url, "select count(*) from totals") == 2
    with pytest.raises(Exception, match="half"):
        scalar(target_url, "select count(*) from half")

    unset = run(client, {"name": "sql", "kind": "sql", "script": "select 1", "database_env": "CHORDBEAT_SQL_NOT_SET"})
    assert unset["error"].endswith("database_env: the variable CHORDBEAT_SQL_NOT_SET is not set on this worker")


def test_one_line_scripts_and_function_bodies_run_as_written(
    enable: Enable, worker: Any, client: Celery, target_url: str
) -> None:
    enable(sql_urls={"CHORDBEAT_SQL_REPORTING": target_url})
    setup = "CREATE TABLE totals (n integer, name varchar(20)); INSERT INTO totals VALUES (7, 'old');"
    # The example of docs/schedules.md, on one line.
    refresh = "DELETE FROM totals; INSERT INTO totals SELECT 1, 'fresh';"
    if target_url.startswith("postgresql"):
        body = (
            "CREATE FUNCTION bump(k integer) RETURNS integer AS $$\nBEGIN\n  UPDATE totals SET n = n + k;\n"
            "  RETURN k;\nEND;\n$$ LANGUAGE plpgsql;\n"
            "CREATE FUNCTION tag() RETURNS text AS $fn$ SELECT 'a;b' $fn$ LANGUAGE sql;\n"
            "SELECT bump(41); UPDATE totals SET name = tag() WHERE name LIKE 'fr%';"
        )
    else:
        body = (
            "CREATE TABLE log (n integer);\nCREATE TRIGGER keep AFTER UPDATE ON totals BEGIN\n"
            "  INSERT INTO log VALUES (new.n); UPDATE log SET n = n;\nEND;\n"
            "UPDATE totals SET n = n + 41; UPDATE totals SET name = 'a;b' WHERE name LIKE 'fr%';"
        )
    for name, script in (("setup", setup), ("refresh", refresh), ("body", body)):
        done = run(client, {"name": name, "kind": "sql", "script": script, "database_env": "CHORDBEAT_SQL_REPORTING"})
        assert done["status"] == "completed", f"{name}: {done['error']}"
    assert scalar(target_url, "select n || ' ' || name from totals") == "42 a;b"


def test_sql_steps_never_read_the_workers_own_settings(enable: Enable, worker: Any, client: Celery) -> None:
    enable()
    for variable, reason in (
        ("CHORDBEAT_DATABASE_URL", "is one of the worker's own settings"),
        ("CHORDBEAT_BROKER_URL", "is one of the worker's own settings"),
        ("FLOWER_BASIC_AUTH", "is one of the worker's own settings"),
        ("REPORTING_DB", "does not start with CHORDBEAT_SQL_ (CHORDBEAT_SQL_ENV_PREFIX)"),
    ):
        step = {"name": "s", "kind": "sql", "script": "select 1", "database_env": variable}
        assert f"steps[0].database_env: {variable} {reason}" in refused(client, step)


# --- definitions --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("step", "field", "reason"),
    [
        ({"kind": "executable"}, "steps[0].argv", "non-empty list of strings"),
        ({"kind": "executable", "argv": "/bin/sh"}, "steps[0].argv", "non-empty list of strings"),
        ({"kind": "executable", "argv": ["/x"], "task": "t"}, "steps[0].task", "unknown field"),
        ({"kind": "executable", "argv": ["/x"], "env": {"A": 1}}, "steps[0].env", "string values"),
        ({"kind": "executable", "argv": ["/x", "a\0b"]}, "steps[0].argv", "NUL"),
        ({"kind": "executable", "argv": ["/x"], "env": {"A": "\0"}}, "steps[0].env.A", "NUL"),
        ({"kind": "executable", "argv": ["/x"], "env": {"A-B": "1"}}, "steps[0].env.A-B", "not an environment"),
        ({"kind": "executable", "argv": ["/x"], "env": {"LD_AUDIT": "1"}}, "steps[0].env.LD_AUDIT", "may not be"),
        ({"kind": "executable", "argv": ["x"]}, "steps[0].argv", "must be an absolute path"),
        ({"kind": "executable", "argv": ["/x", "y" * 70000]}, "steps[0].argv", "more than"),
        ({"kind": "sql", "script": "select 1"}, "steps[0].database_env", "is required"),
        (
            {"kind": "sql", "script": "select 1", "database_env": "postgres://u:p@h/db"},
            "steps[0].database_env",
            "must name an environment variable",
        ),
        (
            {"kind": "sql", "script": "select 1", "database_env": "CHORDBEAT_DATABASE_URL"},
            "steps[0].database_env",
            "the worker's own settings",
        ),
        ({"kind": "sql", "database_env": "DB"}, "steps[0].script", "is required"),
        ({"kind": "sql", "database_env": "DB", "script": "x" * 70000}, "steps[0].script", "more than"),
        ({"kind": "shell", "argv": ["x"]}, "steps[0].kind", "must be one of task, executable, sql"),
        ({"task": "chordbeat.steps.sql"}, "steps[0].task", 'use "kind": "sql"'),
        ({"task": "celery.starmap"}, "steps[0].task", "Celery's own tasks"),
        ({"task": "chordbeat.recover"}, "steps[0].task", "chordbeat's own tasks"),
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
    assert split_statements("DELETE FROM t; INSERT INTO t SELECT 1;") == ["DELETE FROM t;", "INSERT INTO t SELECT 1;"]
    function = "CREATE FUNCTION f() RETURNS int AS $body$ BEGIN RETURN 1; END; $body$ LANGUAGE plpgsql;"
    assert split_statements(f"{function} SELECT f();") == [function, "SELECT f();"]
    assert split_statements("select 1; -- done\n;\n/* nothing */") == ["select 1; -- done"]


# --- a program dies with its worker (issue 8) ---------------------------------------------------


@pytest.mark.slow
def test_a_program_dies_with_the_pool_process_that_started_it(
    client: Celery, settings: Settings, tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    # The shell and its two children: one in the background, one in the foreground.
    script = f"echo $$ >> {pids}; sleep 300 & sleep 300"
    worker_settings = replace(settings, step_kinds=STEP_KINDS, executable_allow=(SH,))
    groups: list[int] = []
    try:
        with processes.worker(worker_settings, tmp_path, "w1") as w1:
            apply(client, {"name": "long", "kind": "executable", "argv": [SH, "-c", script], "timeout": 120})
            execution_id = call(client, "chordbeat.trigger_schedule", name="kinds")["execution_id"]
            wait_for(lambda: pids.exists() and pids.read_text().strip(), 30, what="the program to start")
            shell = int(pids.read_text().split()[0])
            group = int(stat_fields(shell)[2])
            groups.append(group)
            wait_for(lambda: len(group_members(group)) >= 3, 10, what="the shell's children to start")
            pool_child = shell
            while int(stat_fields(pool_child)[1]) != w1.pid:
                pool_child = int(stat_fields(pool_child)[1])
                assert pool_child > 1, "the program does not descend from the worker"
            os.kill(pool_child, signal.SIGKILL)
            wait_for(lambda: not group_members(group), 15, what=f"every process of group {group} to be gone")
            call(client, "chordbeat.cancel_execution", execution_id=execution_id)
    finally:
        # Whatever a failing run left behind, the re-queued attempt's program included.
        for pgid in groups + [int(p) for p in (pids.read_text().split() if pids.exists() else [])]:
            for pid in group_members(pgid):
                os.kill(pid, signal.SIGKILL)


# --- argv[0] is resolved once (issue 36) --------------------------------------------------------

#: A process that swaps ``link`` between two targets as fast as it can, until killed.
SWAPPER = """
import os, sys
link, first, second = sys.argv[1:]
spare = link + ".new"
while True:
    for target in (first, second):
        os.symlink(target, spare)
        os.replace(spare, link)
"""


def test_a_symlink_swapped_while_steps_start_never_runs_the_program_off_the_allowlist(tmp_path: Path) -> None:
    allowed, other = tmp_path / "allowed", tmp_path / "other"
    allowed.mkdir()
    other.mkdir()
    marker = tmp_path / "evil-ran"
    for path, body in ((allowed / "ok", "exit 0"), (other / "evil", f"echo ran >> {marker}")):
        path.write_text(f"#!{SH}\n{body}\n")
        path.chmod(0o755)
    link = tmp_path / "program"
    link.symlink_to(allowed / "ok")
    swapper = subprocess.Popen([PY, "-c", SWAPPER, str(link), str(allowed / "ok"), str(other / "evil")])
    ran = refused_here = 0
    try:
        # Each start is one race between the allowlist check and the exec; the window before the
        # fix was a few microseconds wide, so many starts are tried (10 of 400 got through).
        for _ in range(2000):
            try:
                run_executable([str(link)], allow=(f"{allowed}/",))
                ran += 1
            except StepError as exc:
                assert "is not in CHORDBEAT_EXECUTABLE_ALLOW" in str(exc) or "no such file" in str(exc), exc
                refused_here += 1
            assert not marker.exists(), f"a program off the allowlist ran (after {ran} runs, {refused_here} refusals)"
    finally:
        swapper.kill()
        swapper.wait()
    assert ran and refused_here, "the swap raced with the starts both ways"
