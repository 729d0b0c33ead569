"""The README's first step works as written: a newcomer's first contact must not be rotten."""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celeryapp.application import ChordbeatCelery
from celeryapp.messaging.redis_client import get_redis
from celeryapp.monitoring.worker_registry import live_workers
from tests.support.helpers import call, finished
from tests.support.processes import Process
from tests.support.servers import RedisServer, free_port, wait_for
from tests.support.terminals import in_pty, screen_lines

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def test_the_readmes_first_step_runs_as_written(
    app: ChordbeatCelery, client: Celery, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    text = README.read_text()
    code = re.search(r"```python\n(# hr/steps.py\n.*?)```", text, re.S)
    assert code, "the README shows the first step's module"
    (tmp_path / "hr").mkdir()
    (tmp_path / "hr" / "__init__.py").write_text("")
    (tmp_path / "hr" / "steps.py").write_text(code.group(1))
    assert "CHORDBEAT_TASK_MODULES=hr.steps" in text and "chordbeat run nightly-hr-sync --wait" in text
    sys.path.insert(0, str(tmp_path))
    try:
        importlib.import_module("hr.steps")  # what CHORDBEAT_TASK_MODULES makes every worker do
        request.getfixturevalue("worker")
        step = re.search(r"`(\{name: \"HR import\".*?\})`", text)
        assert step, "the README shows the step's entry in a schedule"
        steps: list[Any] = [
            {"name": "HR import", "task": "hr.import_people", "kwargs": {"full": True}},
            {"name": "partial", "task": "hr.import_people", "kwargs": {"full": False}},
        ]
        definition = {"name": "nightly-hr-sync", "every": 3600, "payload": {"initiator": "hr"}, "steps": steps}
        call(client, "chordbeat.apply_schedule", definition=definition)
        run = finished(client, call(client, "chordbeat.trigger_schedule", name="nightly-hr-sync")["execution_id"])
        assert run["status"] == "completed", run
        assert [a["status"] for a in run["activities"]] == ["complete", "complete_with_warning"]
        assert run["activities"][1]["message"] == "partial import only"
    finally:
        sys.path.remove(str(tmp_path))
        for name in ("hr.steps", "hr"):
            sys.modules.pop(name, None)
        app.tasks.pop("hr.import_people", None)


#: The README's route to a step of one's own, in its words: what a newcomer runs and reads.
ROUTE = ("CHORDBEAT_TASK_MODULES=hr.steps make run", ". .run/cli.env", "chordbeat apply FILE")


def readme_step_module(tmp_path: Path) -> Path:
    """The README's hr/steps.py, written where a newcomer would put it; the directory it is in."""
    text = README.read_text()
    code = re.search(r"```python\n(# hr/steps.py\n.*?)```", text, re.S)
    assert code, "the README shows the first step's module"
    project = tmp_path / "project"
    (project / "hr").mkdir(parents=True)
    (project / "hr" / "__init__.py").write_text("")
    (project / "hr" / "steps.py").write_text(code.group(1))
    return project


def schedule_file(path: Path, name: str, step: str) -> Path:
    path.write_text(f"schedules:\n  - name: {name}\n    every: 3600\n    steps:\n      - {step}\n")
    return path


@pytest.fixture
def make_run(redis_server: RedisServer, tmp_path: Path) -> Iterator[tuple[Process, Path, Path]]:
    """`make run` as the README starts it (its run.sh: the Makefile only adds the venv), on this
    test's Redis, a database and ports of its own: the process, its run directory, the project."""
    redis.Redis.from_url(redis_server.url).flushall()
    project = readme_step_module(tmp_path)
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CHORDBEAT_", "FLOWER_"))}
    env.update(
        CHORDBEAT_TASK_MODULES="hr.steps",
        PYTHONPATH=str(project),
        CHORDBEAT_RUN_DIR=str(run_dir),
        CHORDBEAT_BROKER_URL=redis_server.url,
        CHORDBEAT_DATABASE_URL=f"sqlite:///{tmp_path / 'run.db'}",
        CHORDBEAT_WEB_PORT=str(free_port()),
        FLOWER_PORT=str(free_port()),
        PYTHONUNBUFFERED="1",
    )
    process = Process(["bash", str(ROOT / "deploy" / "local" / "run.sh")], env, tmp_path / "make-run.log")
    try:
        yield process, run_dir, project
    finally:
        process.stop()


def test_make_run_ends_with_the_addresses_and_the_readmes_own_file_route_works(
    make_run: tuple[Process, Path, Path], redis_server: RedisServer, tmp_path: Path
) -> None:
    process, run_dir, project = make_run
    wait_for(lambda: "chordbeat is up" in process.output(), 120, 0.5, what="make run's banner")
    output = process.output()
    local = dict(line.split("=", 1) for line in (run_dir / "local.env").read_text().split())
    first = "\n".join(output.splitlines()[:15])
    for secret in (local["LOCAL_WEB_PASSWORD"], local["LOCAL_FLOWER_PASSWORD"]):
        assert secret in first and secret in output[output.index("chordbeat is up") :]
    assert "Dashboard: http://127.0.0.1:" in first and "Flower:    http://127.0.0.1:" in first
    assert "Connection refused" not in output and "setuptools" not in output
    assert "beat entries not updated" not in output

    # The README's own-file route, from another directory, as a person types it.
    assert all(step in README.read_text() for step in ROUTE)
    step = re.search(r"`(\{name: \"HR import\".*?\})`", README.read_text())
    assert step, "the README shows the step's entry in a schedule"
    own = schedule_file(project / "hr.yaml", "hr-import", step.group(1))
    cli_env = run_dir / "cli.env"

    def apply(path: Path, before: str = "") -> tuple[int, str]:
        script = f". {cli_env}; {before}chordbeat apply --prune {path}"
        return in_pty(["bash", "-c", script], {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}, cwd=str(project))

    client = get_redis(redis_server.url)
    wait_for(lambda: any("chordbeat" in e.queues for e in live_workers(client)), 60, what="the steps worker")
    # The CLI without the task modules (the old cli.env): the workers say what they have.
    status, shown = apply(own, "unset CHORDBEAT_TASK_MODULES; ")
    assert status == 0, shown
    assert "applied (source hr): added hr-import" in shown and "note:" not in shown
    typo = schedule_file(project / "typo.yaml", "hr-typo", step.group(1).replace("import_people", "import_peple"))
    status, shown = apply(typo)
    lines = screen_lines(shown)
    assert status == 1 and all(len(line) <= 80 for line in lines), shown
    assert "task 'hr.import_peple' is not registered on the workers of queue 'chordbeat'" in " ".join(
        line.strip() for line in lines
    )

    # No worker: checked against the CLI's own tasks (cli.env names the modules), and said so.
    process.stop()
    wait_for(lambda: not live_workers(client), 30, what="the stopped workers to leave the registry")
    status, shown = apply(schedule_file(project / "hr2.yaml", "hr-import-2", step.group(1)))
    said = " ".join(line.strip() for line in screen_lines(shown))
    assert status == 0, shown
    assert "note: no worker has published its tasks; checked against this process's tasks" in said
    assert "(CHORDBEAT_TASK_MODULES=hr.steps)" in said
    status, shown = apply(typo)
    said = " ".join(line.strip() for line in screen_lines(shown))
    assert status == 1 and "task 'hr.import_peple' is not registered in this process" in said, shown
