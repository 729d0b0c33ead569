"""Engines and transactions, one engine per database URL and process."""

from __future__ import annotations

import logging
import os
import random
import select
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

from sqlalchemy import Connection, CursorResult, Engine, Executable, create_engine, event, make_url
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import Session, sessionmaker

logger = logging.getLogger(__name__)
T = TypeVar("T")

#: Milliseconds a SQLite writer waits for another process's write lock before giving up.
SQLITE_BUSY_TIMEOUT_MS = 30_000
#: Seconds a new PostgreSQL connection may take to be ready. libpq's default is to wait for ever
#: on a server that accepted the TCP connection and answers nothing (frozen, overloaded), and a
#: host that drops packets holds a connect for the OS's SYN retries (over 2 minutes on Linux):
#: a step, a recovery pass or beat's repair would hang that long. The URL's own value wins.
PG_CONNECT_TIMEOUT_S = 10
#: PostgreSQL's isolation level, set on every engine whatever the server's or the database's
#: default: every compare-and-set and lock here is written for READ COMMITTED (a statement that
#: waited for a row lock re-checks its condition on the row's newest version). Under REPEATABLE
#: READ the same wait ends in a serialization failure instead.
PG_ISOLATION_LEVEL = "READ COMMITTED"

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


def _pooler_aware(engine: Engine) -> None:
    told = False

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Behind a pooler in transaction pooling (PgBouncer's usual mode) each transaction may
        # run on another server connection, shared with the pool's other clients: a statement
        # prepared on one is missing on the next, or its name is taken there (psycopg prepares
        # after 5 executions). A pooler answers the connection with a key of its own: the process
        # id it gives is not the server's. Where they are safe, prepared statements are kept: they
        # spare the server planning the step path's statements (docs/operations.md, "Behind PgBouncer").
        with dbapi_connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid(), current_setting('default_transaction_isolation')")
            server_pid, level = cursor.fetchone()
            pooled = server_pid != dbapi_connection.info.backend_pid
            if pooled:
                dbapi_connection.prepare_threshold = None
            elif level != PG_ISOLATION_LEVEL.lower():
                # The engine's level makes each BEGIN name it; statements sent without one
                # (autocommit) run at the session's default. Through a pooler the session is
                # not ours to set (it would leak to the pool's other clients and be missing on
                # the other server connections): there the role's or database's default must be
                # READ COMMITTED, as PostgreSQL's own is.
                cursor.execute(f"SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL {PG_ISOLATION_LEVEL}")
        dbapi_connection.commit()
        nonlocal told
        if pooled and not told:
            told = True
            _tell_pooler(level)

    @event.listens_for(engine, "handle_error")
    def _on_error(context: ExceptionContext) -> None:
        if context.original_exception is not None and connection_refused(context.original_exception):
            # Replaced, alone: the others in the pool may be fine (another server connection).
            context.is_disconnect = True
            context.invalidate_pool_on_disconnect = False


def _tell_pooler(level: str) -> None:
    logger.info("a connection pooler is in front of the database: no statement is prepared on the server")
    if level != PG_ISOLATION_LEVEL.lower():
        logger.warning(
            "the database's default isolation level is %r behind a connection pooler: statements sent alone "
            "run at it (they are correct, but wait and are tried again more); make it %r for chordbeat's role "
            "(ALTER ROLE ... SET default_transaction_isolation = %r)",
            level,
            PG_ISOLATION_LEVEL.lower(),
            PG_ISOLATION_LEVEL.lower(),
        )


#: SQLSTATEs of a statement refused for what its connection holds, not for what it says: the
#: server connection a pooler chose lacks the statement the client prepared on another (26000),
#: or has one of the same name (42P05). Nothing ran; another connection runs it.
CONNECTION_SQLSTATES = {"26000": "prepared statement missing", "42P05": "prepared statement name taken"}


def _sqlstate(error: BaseException) -> str | None:
    original = getattr(error, "orig", None) or error
    code = getattr(original, "sqlstate", None) or getattr(original, "pgcode", None)
    return code if isinstance(code, str) else None


def connection_refused(error: BaseException) -> bool:
    """True when ``error`` (the driver's, or SQLAlchemy's wrapping it) is the fault of the
    connection it was sent on, found out when the statement was sent (it did not run): the
    connection is to be replaced and the work run on another."""
    return _sqlstate(error) in CONNECTION_SQLSTATES


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
                kwargs["isolation_level"] = PG_ISOLATION_LEVEL
                if "connect_timeout" not in make_url(url).query:
                    kwargs["connect_args"] = {"connect_timeout": PG_CONNECT_TIMEOUT_S}
            else:
                kwargs = {"pool_size": 5, "pool_pre_ping": True}
            engine = create_engine(url, **kwargs)
            if engine.dialect.name == "sqlite":
                _configure_sqlite(engine)
            elif engine.dialect.name == "postgresql":
                _replace_closed_connections(engine)
                _pooler_aware(engine)
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


#: SQLSTATEs of a transaction the server aborted to let others go on, which may simply be run
#: again: a deadlock (40P01) and a serialization failure (40001); and those of a statement
#: refused for its connection's sake before it ran (see ``CONNECTION_SQLSTATES``), run again on
#: another connection.
RETRIED_SQLSTATES = {"40P01": "deadlock", "40001": "serialization failure", **CONNECTION_SQLSTATES}
#: How many times :func:`retrying` runs a transaction in all before the failure is raised.
CONFLICT_TRIES = 6
#: Seconds the first pause before running again may last at most; each next one doubles, up to
#: ``CONFLICT_MAX_PAUSE_S``. A pause is drawn at random below its bound, so that the
#: transactions that deadlocked do not meet again at the same moment.
CONFLICT_FIRST_PAUSE_S = 0.05
CONFLICT_MAX_PAUSE_S = 1.0


def conflict_of(error: BaseException) -> str | None:
    """The SQLSTATE of a deadlock, a serialization failure or a statement refused for its
    connection (the driver's error, or SQLAlchemy's wrapping it); ``None`` for any other error."""
    code = _sqlstate(error)
    return code if code in RETRIED_SQLSTATES else None


def retrying(what: str, run: Callable[[], T], *, tries: int = CONFLICT_TRIES) -> T:
    """``run()``, run again (bounded, with jittered backoff) when the database aborted it as a
    deadlock's victim or for a serialization failure; any other error is raised at once.

    ``run`` must be a whole unit of work: one transaction, opened and committed inside it, or
    statements each committing alone that are all right to run again. Never a part of a
    transaction (the server rolled all of it back), and nothing sent to the outside inside it:
    it returns what to send, sent once it has returned.
    """
    number = 0
    while True:
        number += 1
        try:
            return run()
        except Exception as exc:
            code = conflict_of(exc)
            if code is None or number >= tries:
                raise
            pause_s = random.uniform(0, min(CONFLICT_MAX_PAUSE_S, CONFLICT_FIRST_PAUSE_S * 2 ** (number - 1)))
            logger.warning(
                "%s: aborted by the database (%s, SQLSTATE %s); running it again in %.3f s (try %s of %s)",
                what,
                RETRIED_SQLSTATES[code],
                code,
                pause_s,
                number + 1,
                tries,
            )
            time.sleep(pause_s)


def retried_transaction(url: str, what: str, work: Callable[[Session], T]) -> T:
    """``work(session)`` in a transaction of its own, run again as :func:`retrying` does."""

    def attempt() -> T:
        with transaction(url) as session:
            return work(session)

    return retrying(what, attempt)


def affected(session: Session, statement: Executable) -> int:
    """Run an UPDATE or DELETE and return how many rows it changed.

    A guarded ``UPDATE ... WHERE <expected state>`` is how every transition is made: 0 rows
    means someone else got there first, and the caller must do nothing.
    """
    result = cast(CursorResult[Any], session.execute(statement))
    return int(result.rowcount)


#: Execution option of bulk statements whose rows the session does not hold: nothing to sync.
NO_SYNC = {"synchronize_session": False}
