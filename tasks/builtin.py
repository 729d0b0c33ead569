"""Built-in step tasks behind the ``executable`` and ``sql`` step kinds."""

from __future__ import annotations

from typing import Any

from celeryapp import app, step_kinds


@app.task(name="chordbeat.steps.executable")
def executable(argv: list[str], cwd: str | None = None, env: dict[str, str] | None = None) -> dict[str, Any]:
    return step_kinds.run_executable(argv, cwd, env)


@app.task(name="chordbeat.steps.sql")
def sql(script: str, database_env: str) -> dict[str, Any]:
    return step_kinds.run_sql(script, database_env)
