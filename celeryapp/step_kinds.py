"""Step kinds beyond Celery tasks: an executable (argv) and a SQL script.

They run inside the step runner like any step task, so heartbeats, cancels and timeouts apply.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Engine, create_engine, event

from celeryapp import outcome
from celeryapp.context import current_step

#: Characters of an executable's combined output kept on its activity (the end of it).
OUTPUT_CHARS = 4000
#: Variables an executable inherits from the worker; everything else comes from its definition,
#: so secrets in the worker's environment do not leak into scripts.
INHERITED_ENV = ("PATH", "LANG", "LC_ALL", "HOME", "TZ", "TMPDIR")


class StepError(Exception):
    """Raised when an executable or SQL step fails; the message is the activity's error."""


def tail(text: str, limit: int = OUTPUT_CHARS) -> str:
    return text if len(text) <= limit else "..." + text[-(limit - 3) :]


def _kill_group(process: subprocess.Popen[str]) -> str:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    output, _ = process.communicate()
    return output or ""


def run_executable(argv: list[str], cwd: str | None = None, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Run ``argv``; exit code 0 completes the step with the output's tail, anything else fails it."""
    context = current_step()
    timeout = context.timeout_s if context else None
    environment = {k: os.environ[k] for k in INHERITED_ENV if k in os.environ}
    environment.update(env or {})
    try:
        process = subprocess.Popen(
            argv,
            cwd=cwd,
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group: a timeout or cancel kills its children too
        )
    except OSError as exc:
        raise StepError(f"cannot start {argv[0]!r}: {exc.strerror}") from None
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        output = _kill_group(process)
        raise StepError(f"timed out after {timeout:g}s; output: {tail(output, 1000)}") from None
    except BaseException:  # cancelled (StepCancelled) or the worker shutting down: leave nothing behind
        _kill_group(process)
        raise
    if process.returncode != 0:
        raise StepError(f"exit code {process.returncode}: {tail(output, 1000)}")
    return {"exit_code": 0, "output": tail(output)}


def split_statements(script: str) -> list[str]:
    """Split a script into statements at the semicolons that end them (not those inside quotes)."""
    statements: list[str] = []
    current = ""
    for line in script.splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            statements.append(current.strip())
            current = ""
    if current.strip():
        statements.append(current.strip())
    return [s for s in statements if s.rstrip(";").strip()]


def _transactional_ddl(engine: Engine) -> None:
    # The sqlite3 driver commits before DDL on its own; let SQLAlchemy own the transaction so a
    # failing script leaves nothing behind, CREATE TABLE included.
    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN")


def run_sql(script: str, database_env: str) -> dict[str, Any]:
    """Run the script's statements in one transaction against the URL in ``$database_env``."""
    url = os.environ.get(database_env)
    if not url:
        raise StepError(f"database_env: the variable {database_env} is not set on this worker")
    statements = split_statements(script)
    engine = create_engine(url)
    if engine.dialect.name == "sqlite":
        _transactional_ddl(engine)
    rows = 0
    try:
        with engine.begin() as connection:
            for statement in statements:
                result = connection.exec_driver_sql(statement)
                rows += max(result.rowcount, 0)
    except Exception as exc:
        raise StepError(f"{type(exc).__name__}: {exc}".splitlines()[0]) from None
    finally:
        engine.dispose()
    return outcome.completed(f"{len(statements)} statements, {rows} rows affected")
