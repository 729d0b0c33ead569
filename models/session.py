"""Engines and transactions, one engine per database URL and process."""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

from sqlalchemy import Connection, CursorResult, Engine, Executable, create_engine, event, make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import Session, sessionmaker

#: Milliseconds a SQLite writer waits for another process's write lock before giving up.
SQLITE_BUSY_TIMEOUT_MS = 30_000
#: Seconds a new PostgreSQL connection may take to be ready. libpq's default is to wait for ever
#: on a server that accepted the TCP connection and answers nothing (frozen, overloaded), and a
#: host that drops packets holds a connect for the OS's SYN retries (over 2 minutes on Linux):
#: a step, a recovery pass or beat's repair would hang that long. The URL's own value wins.
PG_CONNECT_TIMEOUT_S = 10

_lock = threading.Lock()
_engines: dict[tuple[int, str], tuple[Engine, sessionmaker[Session], sessionmaker[Session]]] = {}
#: Execution option marking a read-only transaction (SQLite then begins without the write lock).
READ_ONLY = "chordbeat_read_only"


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy, not the driver, open transactions (see _on_begin).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        # WAL lets readers go on while one process writes; the busy timeout makes several worker
        # processes queue for the write lock instead of failing with "database is locked".
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # Take the write lock up front: a deferred transaction that reads and then writes can fail
        # at once with SQLITE_BUSY instead of waiting, which would break compare-and-set updates.
        # Read-only transactions need no lock: with WAL they read beside a writer.
        conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get(READ_ONLY) else "BEGIN IMMEDIATE")


def _replace_closed_connections(engine: Engine) -> None:
    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        # A connection resting in the pool has nothing to read. If its socket is readable, the
        # server has closed it (a restart, an administrator, an idle timeout: PostgreSQL sends
        # its reason, then the kernel the end of the stream), and the pool replaces it before use.
        # This catches what pool_pre_ping catches without its round trip to the server, which
        # every transaction of every step paid.
        try:
            poller = select.poll()
            poller.register(dbapi_connection.fileno(), select.POLLIN)
            closed = bool(poller.poll(0))
        except Exception as exc:  # no socket any more (the driver knows it is closed)
            raise DisconnectionError("connection closed") from exc
        if closed:
            raise DisconnectionError("the server closed the connection")


def get_engine(url: str) -> Engine:
    return _get(url)[0]


def _get(url: str) -> tuple[Engine, sessionmaker[Session], sessionmaker[Session]]:
    # Keyed by pid: a connection pool must never cross a fork (prefork worker children).
    key = (os.getpid(), url)
    with _lock:
        found = _engines.get(key)
        if found is None:
            kwargs: dict[str, Any] = {}
            if url.startswith("sqlite"):
                kwargs = {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}}
            elif url.startswith("postgresql"):
                kwargs["pool_size"] = 5
                if "connect_timeout" not in make_url(url).query:
                    kwargs["connect_args"] = {"connect_timeout": PG_CONNECT_TIMEOUT_S}
            else:
                kwargs = {"pool_size": 5, "pool_pre_ping": True}
            engine = create_engine(url, **kwargs)
            if engine.dialect.name == "sqlite":
                _configure_sqlite(engine)
            elif engine.dialect.name == "postgresql":
                _replace_closed_connections(engine)
            reader = engine.execution_options(**{READ_ONLY: True})
            found = (engine, sessionmaker(engine, expire_on_commit=False), sessionmaker(reader, expire_on_commit=False))
            _engines[key] = found
    return found


@contextmanager
def transaction(url: str, *, read_only: bool = False) -> Iterator[Session]:
    """A session whose work is committed when the block ends and rolled back if it raises.

    ``read_only`` transactions must not write; on SQLite they do not wait for the write lock.
    """
    _engine, writer, reader = _get(url)
    session = (reader if read_only else writer)()
    try:
        with session.begin():
            yield session
    finally:
        session.close()


@contextmanager
def connection(url: str) -> Iterator[Connection]:
    """A bare connection in a transaction, committed when the block ends and rolled back if it
    raises: for the step path's few prebuilt Core statements, without a session's bookkeeping."""
    with _get(url)[0].begin() as conn:
        yield conn


@contextmanager
def autocommit(url: str, *, read_only: bool = False) -> Iterator[Connection]:
    """A bare connection whose statements each commit by themselves on PostgreSQL.

    For one statement (a data-modifying CTE is atomic), or for statements each correct alone:
    reads before a compare-and-set that checks again what they read. A transaction around them
    would add two round trips, ``BEGIN`` and ``COMMIT``, each a wait on the server. Elsewhere the
    block is a transaction, which with ``read_only`` (statements that write nothing) does not
    wait for SQLite's write lock.
    """
    engine = _get(url)[0]
    if engine.dialect.name != "postgresql":
        with (engine.execution_options(**{READ_ONLY: True}) if read_only else engine).begin() as conn:
            yield conn
        return
    with engine.connect() as conn:
        # Set for this checkout only: SQLAlchemy puts the connection back in the pool as it was.
        conn.execution_options(isolation_level="AUTOCOMMIT")
        yield conn


def dispose_all() -> None:
    """Drop every engine of this process (tests and shutdown)."""
    with _lock:
        for (pid, _url), (engine, _writer, _reader) in list(_engines.items()):
            if pid == os.getpid():
                engine.dispose()
        _engines.clear()


def affected(session: Session, statement: Executable) -> int:
    """Run an UPDATE or DELETE and return how many rows it changed.

    A guarded ``UPDATE ... WHERE <expected state>`` is how every transition is made: 0 rows
    means someone else got there first, and the caller must do nothing.
    """
    result = cast(CursorResult[Any], session.execute(statement))
    return int(result.rowcount)


#: Execution option of bulk statements whose rows the session does not hold: nothing to sync.
NO_SYNC = {"synchronize_session": False}
