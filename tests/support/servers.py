"""Real Redis, PostgreSQL and PgBouncer servers for the tests, on free loopback ports in temp dirs."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import redis
from sqlalchemy import Engine, create_engine, text

PG_BIN_DIRS = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.02, what: str = "") -> object:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except Exception as exc:  # the condition may not be checkable yet (server starting)
            last_error = exc
        else:
            if value:
                return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}") from last_error


class RedisServer:
    """``persistent`` keeps an append-only file in ``dir`` (fsync every second, as production
    Redis commonly runs), so a graceful stop and start gives the data back."""

    def __init__(self, password: str | None = None, *, persistent: bool = False, also_bind: str | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="chordbeat-redis-"))
        self.port = free_port()
        #: An address it listens on besides 127.0.0.1 (the multi-host lab's, tests/support/lab.py).
        self.also_bind = also_bind
        #: With a password the server refuses unauthenticated clients (``--requirepass``).
        self.password = password
        self.persistent = persistent
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (make test installs it)")
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                # Protected mode refuses every client but loopback ones without a password; the
                # lab's address is on a bridge that only the lab's namespaces reach.
                *([self.also_bind, "--protected-mode", "no"] if self.also_bind else []),
                "--dir",
                str(self.dir),
                "--save",
                "",
                "--appendonly",
                "yes" if self.persistent else "no",
                "--appendfsync",
                "everysec",
                "--daemonize",
                "no",
                "--loglevel",
                "warning",
                *(["--requirepass", self.password] if self.password else []),
            ],
            stdout=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, password=self.password)
        wait_for(client.ping, 10, what="redis-server to answer")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def restart(self) -> None:
        """Kill and start again: without persistence every key is gone, as after a failover."""
        self.stop()
        self.start()

    def terminate(self) -> None:
        """Graceful stop (SIGTERM): clients are disconnected and a persistent server syncs its file."""
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            self.proc = None

    def clear_data(self) -> None:
        """Delete what a stopped server persisted: the next start is a fresh, empty server."""
        assert self.proc is None, "stop the server first"
        for path in self.dir.iterdir():
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()

    def outage(self, seconds: float, *, how: str = "graceful", keep_data: bool = False) -> None:
        """Take Redis away for ``seconds``, then bring it back on the same port.

        ``how``: ``graceful`` (SIGTERM), ``kill`` (SIGKILL) or ``freeze`` (SIGSTOP/SIGCONT: the
        server keeps its sockets but answers nothing, like a stalled host). ``keep_data`` restarts
        from the append-only file; otherwise Redis comes back empty.
        """
        assert self.proc is not None
        if how == "freeze":
            self.proc.send_signal(signal.SIGSTOP)
            time.sleep(seconds)  # the fault's length, not a synchronisation
            self.proc.send_signal(signal.SIGCONT)
            return
        client = redis.Redis(port=self.port, password=self.password)
        if keep_data:
            # Switch the append-only file on and wait until it holds everything.
            client.config_set("appendonly", "yes")
            wait_for(
                lambda: (
                    client.info("persistence")["aof_rewrite_in_progress"] == 0
                    and client.info("persistence")["aof_enabled"] == 1
                ),
                20,
                what="the append-only file to be written",
            )
        client.close()
        (self.terminate if how == "graceful" else self.stop)()
        if not keep_data:
            self.clear_data()
        time.sleep(seconds)  # the fault's length, not a synchronisation
        was_persistent, self.persistent = self.persistent, keep_data
        self.start()
        if keep_data and not was_persistent:
            self.persistent = False
            redis.Redis(port=self.port, password=self.password).config_set("appendonly", "no")

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class PostgresServer:
    """A throwaway cluster; run as the ``postgres`` user when the tests run as root."""

    def __init__(self, also_listen: str | None = None) -> None:
        """``also_listen``: an interface (``10.1.2.1/24``) it listens on besides 127.0.0.1, trusting
        its network's clients as loopback ones (the multi-host lab's, tests/support/lab.py)."""
        self.also_listen = ipaddress.IPv4Interface(also_listen) if also_listen else None
        if not PG_BIN_DIRS:
            raise RuntimeError("PostgreSQL server binaries are not installed (make test installs them)")
        self.bin = PG_BIN_DIRS[0]
        self.dir = Path(tempfile.mkdtemp(prefix="chordbeat-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self.user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name

    def _run(self, *argv: str) -> None:
        cmd = [str(self.bin / argv[0]), *argv[1:]]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def start(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-U", self.user, "-A", "trust", "--no-sync", "-E", "UTF8")
        if self.also_listen is not None:
            with (self.data / "pg_hba.conf").open("a") as hba:
                hba.write(f"host all all {self.also_listen.network} trust\n")
        self.start_server()

    def start_server(self) -> None:
        """Start the initialised cluster (again) on the same port and wait until it accepts connections."""
        listen = "127.0.0.1" if self.also_listen is None else f"127.0.0.1,{self.also_listen.ip}"
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses={listen} -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.dir / "log"), "-w", "start")

    def stop_server(self, mode: str = "fast") -> None:
        """``pg_ctl stop``: ``fast`` rolls back open transactions and closes every connection."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def postmaster_pid(self) -> int:
        """The running server's main process (its backends are its children)."""
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def create_database(self, name: str, template: str | None = None) -> None:
        engine = create_engine(self.url(), isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else "")))
        engine.dispose()

    def url(self, database: str = "postgres", host: str = "127.0.0.1") -> str:
        return f"postgresql+psycopg://{self.user}@{host}:{self.port}/{database}"

    def close(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)


class PgBouncer:
    """Debian's PgBouncer in transaction pooling, in front of ``postgres``: every database of the
    server under the same name, its clients trusted (as the test server trusts them)."""

    def __init__(self, postgres: PostgresServer, *, pool_size: int = 20, extra: str = "") -> None:
        """``extra``: more lines of the ``[pgbouncer]`` section."""
        self.postgres = postgres
        self.pool_size = pool_size
        self.extra = extra
        self.dir = Path(tempfile.mkdtemp(prefix="chordbeat-pgbouncer-"))
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{self.postgres.user}@127.0.0.1:{self.port}/{database}"

    def _write_config(self) -> Path:
        (self.dir / "users.txt").write_text(f'"{self.postgres.user}" ""\n')
        ini = self.dir / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"* = host=127.0.0.1 port={self.postgres.port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self.dir / 'users.txt'}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {self.pool_size}\n"
            "max_client_conn = 1000\n"
            # Each test's database has a pool of its own: idle server connections are closed
            # soon, or a session's worth of them would use up the server's connections.
            "server_idle_timeout = 5\n"
            # After a failed connect to the server PgBouncer waits this long before the next
            # (15 s by default): a PostgreSQL back from a restart would stay away that long.
            "server_login_retry = 1\n"
            f"admin_users = {self.postgres.user}\n"
            f"logfile = {self.dir / 'pgbouncer.log'}\n"
            f"pidfile = {self.dir / 'pgbouncer.pid'}\n" + self.extra
        )
        return ini

    def start(self) -> None:
        binary = shutil.which("pgbouncer")
        if binary is None:
            raise RuntimeError("pgbouncer is not installed (make test installs it)")
        ini = self._write_config()
        # PgBouncer refuses to run as root: the test server's user runs it.
        user = "postgres" if os.geteuid() == 0 else None
        if user is not None:
            shutil.chown(self.dir, user, user)
            for path in self.dir.iterdir():
                shutil.chown(path, user, user)
        (self.dir / "pgbouncer.pid").unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [binary, str(ini)], user=user, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        engine = create_engine(self.url(), isolation_level="AUTOCOMMIT")
        try:
            wait_for(lambda: _answers(engine), 10, what="pgbouncer to answer")
        finally:
            engine.dispose()

    def stop(self) -> None:
        """SIGKILL: every client connection is cut at once, whatever it was doing."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def _answers(engine: Engine) -> bool:
    with engine.connect() as conn:
        return bool(conn.execute(text("SELECT 1")).scalar())
