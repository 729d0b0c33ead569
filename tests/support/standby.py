"""A PostgreSQL primary with a streaming standby (``pg_basebackup -R``), for failover labs.

The standby streams through a :class:`Relay`, so that a test can cut replication at a moment of
its choosing (:meth:`Relay.hold`: what the primary commits after it never reaches the standby, as
with a standby lagging behind when its primary dies) without touching PostgreSQL's own processes.
Synchronous mode (``synchronous_standby_names = '*'`` and ``synchronous_commit = on``) makes the
primary wait for the standby's flush before it acknowledges a commit.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import threading
import time

from sqlalchemy import create_engine, text

from tests.support.sentinel import Forwarder
from tests.support.servers import PostgresServer


class Relay(Forwarder):
    """A :class:`Forwarder` that can stop passing bytes on (:meth:`hold`): a replication link cut
    without a reset, the primary's WAL piling up in front of it."""

    def __init__(self, target: int) -> None:
        self._flowing = threading.Event()
        self._flowing.set()
        super().__init__(target)

    def hold(self) -> None:
        self._flowing.clear()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:  # type: ignore[override]
        with contextlib.suppress(OSError):
            while True:
                self._flowing.wait()
                data = source.recv(65536)
                if not data or not self._flowing.is_set():
                    # Read while the link was being cut: dropped, as a dead link drops it.
                    break
                sink.sendall(data)
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class Primary(PostgresServer):
    """A primary that keeps WAL for a standby, waiting for it on each commit if ``synchronous``."""

    def __init__(self, *, synchronous: bool) -> None:
        super().__init__()
        self.synchronous = synchronous

    def start_server(self) -> None:
        commit = "-c synchronous_commit=on -c synchronous_standby_names='*'" if self.synchronous else ""
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=on "
            f"-c wal_level=replica -c max_wal_senders=4 -c max_connections=200 {commit}"
        )
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.dir / "log"), "-w", "start")


class Standby(PostgresServer):
    """A copy of ``primary`` taken with ``pg_basebackup -R`` through ``relay``, streaming from it."""

    def __init__(self, primary: Primary, relay: Relay) -> None:
        super().__init__()
        self.primary = primary
        self.relay = relay

    def start(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        self._run(
            "pg_basebackup", "-D", str(self.data), "-h", "127.0.0.1", "-p", str(self.relay.port),
            "-U", self.user, "-R", "-X", "stream", "--no-sync",
        )  # fmt: skip
        self.start_server()

    def start_server(self) -> None:
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200 "
            "-c hot_standby=on"
        )
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.dir / "log"), "-w", "start")

    def promote(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-w", "promote")


class ReplicatedPostgres:
    """``primary`` and its ``standby``; chordbeat reaches whichever is primary through ``address``
    (a moved virtual IP, :meth:`fail_over`)."""

    def __init__(self, *, synchronous: bool) -> None:
        self.primary = Primary(synchronous=synchronous)
        self.primary.start()
        self.relay = Relay(self.primary.port)
        self.standby = Standby(self.primary, self.relay)
        self.standby.start()
        self.address = Forwarder(self.primary.port)

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://{self.primary.user}@127.0.0.1:{self.address.port}/{database}"

    def _scalar(self, server: PostgresServer, sql: str) -> object:
        engine = create_engine(server.url(), isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                return conn.execute(text(sql)).scalar()
        finally:
            engine.dispose()

    def sync_state(self) -> object:
        """How the primary replicates to the standby: ``sync`` or ``async`` (pg_stat_replication)."""
        return self._scalar(self.primary, "SELECT sync_state FROM pg_stat_replication")

    def wait_replayed(self, timeout: float = 30) -> None:
        """Until the standby has replayed everything the primary wrote so far."""
        target = self._scalar(self.primary, "SELECT pg_current_wal_lsn()")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._scalar(self.standby, f"SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn"):
                return
            time.sleep(0.05)
        raise TimeoutError(f"the standby did not replay up to {target} within {timeout}s")

    def fail_over(self) -> None:
        """The primary dies (no shutdown checkpoint), the standby is promoted, the address moves."""
        self.relay.close()
        self.primary._run("pg_ctl", "-D", str(self.primary.data), "-m", "immediate", "-w", "stop")
        self.standby.promote()
        self.address.point_to(self.standby.port)

    def close(self) -> None:
        self.address.close()
        self.relay.close()
        self.standby.close()
        self.primary.close()


def run_sql(url: str, *statements: str) -> None:
    """Each statement in autocommit."""
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            for statement in statements:
                conn.execute(text(statement))
    finally:
        engine.dispose()
