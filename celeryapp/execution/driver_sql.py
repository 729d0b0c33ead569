"""A prebuilt PostgreSQL statement sent straight to the connection's driver (psycopg).

The step path's claim and outcome run for every step; through SQLAlchemy's execution (execution
context, bind and result processing, result objects) each cost the worker more than the driver's
own work for the statement (docs/performance.md, what a step costs). Compiled once for the
dialect, the statement goes to the driver connection SQLAlchemy has checked out, inside whatever
SQLAlchemy made of that checkout (a transaction it commits, or autocommit), so connection
handling stays SQLAlchemy's. What SQLAlchemy does around a statement that matters is kept: its
``before_cursor_execute`` listeners see it, and a driver error is raised as SQLAlchemy's
(:class:`~sqlalchemy.exc.DBAPIError` with the driver's as ``orig``), the connection invalidated
first when it is gone or refused the statement for its own sake, as SQLAlchemy does (callers
tell a database away from a refused statement by that).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, cast

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ClauseElement

from models.session import connection_refused

#: Constants a compiled statement may carry as bind parameters, sent as they are.
_PLAIN = (int, str, float, bool, type(None))


def _constant(name: str, value: Any) -> Any:
    if isinstance(value, enum.Enum):
        value = value.value  # our enum columns store values (models/tables.py)
    if not isinstance(value, _PLAIN):
        raise TypeError(f"driver statement: bind parameter {name!r} holds {type(value).__name__}, not a plain value")
    return value


class DriverStatement:
    """``statement`` (parameters named ``p_*`` given per run), compiled at its first run."""

    def __init__(self, statement: ClauseElement) -> None:
        self.statement = statement
        self._sql: str | None = None
        self._constants: dict[str, Any] = {}

    def _compile(self, conn: Connection) -> str:
        compiled = cast(SQLCompiler, self.statement.compile(dialect=conn.dialect))
        self._constants = {
            name: _constant(name, bind.effective_value)
            for name, bind in compiled.binds.items()
            if not name.startswith("p_") and not name.startswith("%(")
        }
        self._sql = str(compiled)
        return self._sql

    def run(self, conn: Connection, params: Mapping[str, Any]) -> Any:
        """The driver's cursor, its statement run with ``params`` (enum members as their values)."""
        sql = self._sql or self._compile(conn)
        values = {**self._constants, **{k: v.value if isinstance(v, enum.Enum) else v for k, v in params.items()}}
        conn.dispatch.before_cursor_execute(conn, None, sql, values, None, False)
        driver = conn.connection.driver_connection
        dbapi = conn.dialect.loaded_dbapi
        try:
            return driver.execute(sql, values)  # type: ignore[union-attr]
        except dbapi.Error as exc:
            # A prepared statement a pooler's server connection lacked (see models.session) is
            # the connection's fault as a closed one is: replaced, and the work tried again.
            gone = conn.dialect.is_disconnect(exc, driver, None) or connection_refused(exc)
            if gone:
                conn.invalidate(exc)
            raise DBAPIError.instance(
                sql, values, exc, dbapi.Error, connection_invalidated=gone, dialect=conn.dialect
            ) from exc
