"""Built-in step tasks behind the ``executable`` and ``sql`` step kinds."""

from __future__ import annotations

from typing import Any

from celeryapp import app
from celeryapp.context import current_step
from celeryapp.errors import StepError
from celeryapp.worker import step_kinds


def _require(kind: str) -> None:
    # A broker message naming this task directly (or through celery.starmap and the like) runs
    # outside any step: only the step runner, after its own checks, may run it.
    if current_step() is None:
        raise StepError(f"{kind} steps run only as a step of an execution")
    # Checked again here: a definition stored while the kind was enabled must not run after.
    if kind not in app.settings.step_kinds:
        raise StepError(f"{kind} steps are not enabled on this worker (CHORDBEAT_STEP_KINDS)")


@app.task(name="chordbeat.steps.executable")
def executable(argv: list[str], cwd: str | None = None, env: dict[str, str] | None = None) -> dict[str, Any]:
    _require("executable")
    return step_kinds.run_executable(argv, cwd, env, allow=app.settings.executable_allow)


@app.task(name="chordbeat.steps.sql")
def sql(script: str, database_env: str) -> dict[str, Any]:
    _require("sql")
    settings = app.settings
    return step_kinds.run_sql(script, database_env, urls=settings.sql_urls, prefix=settings.sql_env_prefix)
