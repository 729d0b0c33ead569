"""Step kinds beyond Celery tasks: an executable (argv) and a SQL script.

They run inside the step runner like any step task, so heartbeats, cancels and timeouts apply.
What they may run is checked here again against this worker's settings (``step_policy``): a
definition stored under a looser policy must not run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import sqlparse
from sqlalchemy import Engine, create_engine, event

import celeryapp.outcome as outcome
from celeryapp.context import current_step
from celeryapp.domain.step_policy import (
    env_name_refusal,
    executable_refusal,
    program_refusal,
    resolved_program_refusal,
    sql_env_refusal,
)
from celeryapp.errors import StepError
from celeryapp.worker.step_log import note_output

#: Characters of an executable's combined output kept on its activity (the end of it).
OUTPUT_CHARS = 4000
#: Where a program looks for the programs it starts itself.
PROGRAM_PATH = "/usr/local/bin:/usr/bin:/bin"
#: A program's whole environment besides its step's ``env``. Nothing comes from the worker's,
#: which holds the database and broker URLs.
BASE_ENV = {"PATH": PROGRAM_PATH, "LANG": "C.UTF-8"}
#: Runs the program and kills its process group when it ends or the worker dies (see there).
SUPERVISOR = Path(__file__).with_name("step_supervisor.py")
#: Seconds between two looks for a cancel or timeout while a program runs.
POLL_S = 0.25
#: Seconds the supervisor gets to kill the program's group before it is killed itself.
STOP_WAIT_S = 5.0


def tail(text: str, limit: int = OUTPUT_CHARS) -> str:
    return text if len(text) <= limit else "..." + text[-(limit - 3) :]


def program_environment(env: Mapping[str, str] | None) -> dict[str, str]:
    """The program's environment: :data:`BASE_ENV` and its step's ``env``, checked again here."""
    for name in env or {}:
        refusal = env_name_refusal(name)
        if refusal:
            raise StepError(f"env: {refusal}")
    return {**BASE_ENV, **(env or {})}


def _stop(process: subprocess.Popen[str], watch: int) -> str:
    """Stop the program: closing the watch pipe makes the supervisor kill its group."""
    with contextlib.suppress(OSError):
        os.close(watch)
    try:
        output, _ = process.communicate(timeout=STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
    return output or ""


def _wait(process: subprocess.Popen[str], timeout: float | None) -> str:
    """The program's output once it ends; raises ``TimeoutExpired`` after ``timeout`` seconds.

    Short waits in a loop, so a cancel (an exception raised in this thread) lands within
    :data:`POLL_S` instead of when the program ends.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        wait_s = POLL_S if deadline is None else min(POLL_S, max(deadline - time.monotonic(), 0))
        try:
            output, _ = process.communicate(timeout=wait_s)
            return output or ""
        except subprocess.TimeoutExpired:
            if deadline is not None and time.monotonic() >= deadline:
                raise


def open_program(program: str, allow: Sequence[str]) -> int:
    """A descriptor of the file ``program`` names, once that very file is known to be allowed.

    The name is resolved once, by opening it; the allowlist is checked against the path of the
    opened file (the kernel's ``/proc/self/fd/N`` link) and the descriptor is what runs. A
    symlink or directory swapped after the open changes nothing: the descriptor holds the file
    that was checked. (Resolving the name again to execute it, even to a realpath checked a moment
    before, leaves a window in which a swapped symlink runs another program.) ``O_PATH``: no read
    permission needed, and a FIFO named as the program does not block the worker.
    """
    refusal = program_refusal(program)
    if refusal:
        raise StepError(f"argv: {refusal}")
    try:
        fd = os.open(program, os.O_PATH | os.O_CLOEXEC)
    except OSError as exc:
        # Whether a file off the allowlist exists is not the caller's to learn.
        refusal = executable_refusal(program, allow)
        if refusal:
            raise StepError(f"argv: {refusal}") from None
        reason = "no such file" if isinstance(exc, FileNotFoundError) else (exc.strerror or "").lower()
        raise StepError(f"cannot start {program!r}: {reason}") from None
    try:
        refusal = resolved_program_refusal(os.readlink(f"/proc/self/fd/{fd}"), program, allow)
        if refusal:
            raise StepError(f"argv: {refusal}")
        if not stat.S_ISREG(os.fstat(fd).st_mode) or not os.access(f"/proc/self/fd/{fd}", os.X_OK):
            raise StepError(f"cannot start {program!r}: not an executable file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def run_executable(
    argv: list[str], cwd: str | None = None, env: Mapping[str, str] | None = None, *, allow: Sequence[str]
) -> dict[str, Any]:
    """Run ``argv`` if ``allow`` lists its program; exit code 0 completes the step, anything else fails it."""
    environment = program_environment(env)
    program = open_program(argv[0], allow)
    context = current_step()
    timeout = context.timeout_s if context else None
    watch_read, watch = os.pipe()
    try:
        # The supervisor gets the descriptor under the same number and executes it through its
        # own /proc/self/fd link (a script's interpreter opens it by that name too).
        process = subprocess.Popen(
            [sys.executable, "-I", "-S", str(SUPERVISOR), str(watch_read), f"/proc/self/fd/{program}", *argv],
            cwd=cwd,
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            encoding="utf-8",
            errors="replace",
            pass_fds=(watch_read, program),
            start_new_session=True,
        )
    except OSError as exc:
        os.close(watch)
        where = f" (cwd {cwd!r})" if cwd else ""
        raise StepError(f"cannot start {argv[0]!r}{where}: {exc.strerror}") from None
    finally:
        os.close(watch_read)
        os.close(program)
    try:
        output = _wait(process, timeout)
    except subprocess.TimeoutExpired:
        output = _stop(process, watch)
        note_output(output)
        raise StepError(f"timed out after {timeout:g}s; output: {tail(output, 1000)}") from None
    except BaseException:  # cancelled (StepCancelled) or the worker shutting down: leave nothing behind
        note_output(_stop(process, watch))
        raise
    # Its last lines are the attempt's log tail, whatever the exit code.
    note_output(output)
    with contextlib.suppress(OSError):
        os.close(watch)
    if process.returncode != 0:
        raise StepError(f"exit code {process.returncode}: {tail(output, 1000)}")
    return {"exit_code": 0, "output": tail(output)}


def split_statements(script: str) -> list[str]:
    """The script's statements, split by a SQL tokenizer: semicolons inside quotes, comments,
    dollar-quoted bodies (``$$ ... $$``, ``$fn$ ... $fn$``) and trigger bodies do not end one.
    Statements holding nothing but comments are dropped."""
    statements = (s.strip() for s in sqlparse.split(script))
    return [s for s in statements if sqlparse.format(s, strip_comments=True).strip().rstrip(";").strip()]


def _transactional_ddl(engine: Engine) -> None:
    # The sqlite3 driver commits before DDL on its own; let SQLAlchemy own the transaction so a
    # failing script leaves nothing behind, CREATE TABLE included.
    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN")


def run_sql(script: str, database_env: str, *, urls: Mapping[str, str], prefix: str) -> dict[str, Any]:
    """Run the script's statements in one transaction against the URL in ``$database_env``.

    ``urls`` are the worker's variables under ``prefix`` (``Settings.sql_urls``).
    """
    refusal = sql_env_refusal(database_env, prefix)
    if refusal:
        raise StepError(f"database_env: {refusal}")
    url = urls.get(database_env)
    if not url:
        raise StepError(f"database_env: the variable {database_env} is not set on this worker")
    statements = split_statements(script)
    engine = create_engine(url)
    if engine.dialect.name == "sqlite":
        _transactional_ddl(engine)
    rows = 0
    try:
        with engine.begin() as connection:
            # The driver's own cursor, without parameters: a '%' in the script is SQL, not a placeholder.
            cursor = connection.connection.cursor()
            try:
                for statement in statements:
                    cursor.execute(statement)
                    rows += max(cursor.rowcount, 0)
            finally:
                cursor.close()
    except Exception as exc:
        raise StepError(f"{type(exc).__name__}: {exc}".splitlines()[0]) from None
    finally:
        engine.dispose()
    return outcome.completed(f"{len(statements)} statements, {rows} rows affected")
