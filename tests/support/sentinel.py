"""A Redis primary, a replica and three Sentinels on free loopback ports, for failover tests; and
a TCP forwarder that stands for a DNS name or virtual IP moved from one server to another.

Each server and Sentinel has its own directory and config file (Sentinel rewrites its own). The
Sentinels judge a server down after :data:`DOWN_AFTER_MS` and two of them must agree; a failover
may take :data:`FAILOVER_TIMEOUT_MS`.

Given ``replica_clock_shift_s``, the replica's clock is that many seconds off the primary's
(tests/support/clock_shift.c preloaded): a replica on another host, whose clock a failover makes Redis's.
A server keeps its clock when it is started again (:meth:`SentinelCluster.revive`): failing over
and back moves Redis's clock by the shift and back. Given ``steppable_clocks``, every server reads
its shift from a file, and :meth:`SentinelCluster.shift_clock` moves a server's clock while it runs
(a replica's, before failing over to it).

Given an ``address`` (the multi-host lab's bridge, :mod:`tests.support.lab`), every server and Sentinel
also listens there, and the Sentinels know the servers (and each other) by it: the addresses they
hand out must be reachable from the lab's hosts, where 127.0.0.1 is the host's own loopback.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import redis

from celeryapp.config import Settings
from tests.support.processes import clock_shift_library
from tests.support.servers import free_port, wait_for

MASTER = "mymaster"
#: A primary that has not answered a Sentinel's pings for this long is subjectively down.
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 5000
#: Sentinels that must agree the primary is down before one of them fails it over.
QUORUM = 2
SENTINELS = 3


def _binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is not installed (make test installs it)")
    return found


class SentinelCluster:
    def __init__(
        self,
        master: str = MASTER,
        address: str = "127.0.0.1",
        replica_clock_shift_s: float = 0.0,
        steppable_clocks: bool = False,
    ) -> None:
        self.master = master
        self.replica_clock_shift_s = replica_clock_shift_s
        self.steppable_clocks = steppable_clocks
        #: Where the servers and Sentinels are known (besides 127.0.0.1, where the test reaches them).
        self.address = address
        self.dir = Path(tempfile.mkdtemp(prefix="chordbeat-sentinel-"))
        #: Redis servers by port (the primary first, then the replica).
        self.servers: dict[int, subprocess.Popen[bytes]] = {}
        self.sentinels: dict[int, subprocess.Popen[bytes]] = {}
        #: Each server's clock shift by port (its host's clock): kept across a restart.
        self.clock_shifts: dict[int, float] = {}

    @property
    def url(self) -> str:
        """The Sentinel list as chordbeat's settings take it."""
        return ";".join(f"sentinel://{self.address}:{port}/0" for port in self.sentinels)

    def settings_for(self, settings: Settings, **changes: Any) -> Settings:
        """``settings`` with every Redis client (broker, results, RedBeat, chordbeat's own) going
        through this group's Sentinels."""
        url = self.url
        return replace(
            settings, broker_url=url, result_backend=url, redbeat_url=url, sentinel_master=self.master, **changes
        )

    def start(self) -> None:
        try:
            primary = self._server()
            replica = self._server(replica_of=primary, clock_shift_s=self.replica_clock_shift_s)
            wait_for(
                lambda: self.client(replica).info("replication").get("master_link_status") == "up",
                20,
                what="the replica to follow the primary",
            )
            for _ in range(SENTINELS):
                self._sentinel(primary)
            # A failover needs every Sentinel to know the replica and the other Sentinels
            # (found through the primary's hello channel every 2 s).
            wait_for(self._ready, 30, interval=0.1, what="the Sentinels to know each other and the replica")
        except BaseException:
            self.close()
            raise

    def _server(self, replica_of: int | None = None, port: int | None = None, clock_shift_s: float = 0.0) -> int:
        port = port or free_port()
        self.clock_shifts[port] = clock_shift_s
        home = self.dir / f"redis-{port}"
        home.mkdir(exist_ok=True)
        argv = [_binary("redis-server"), "--port", str(port), "--bind", *self._binds(), "--dir", str(home)]
        argv += ["--save", "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning"]
        argv += ["--logfile", str(home / "log"), "--protected-mode", self._protected()]
        if replica_of is not None:
            argv += ["--replicaof", self.address, str(replica_of)]
        env = None
        if clock_shift_s or self.steppable_clocks:
            self._clock_file(port).write_text(f"{clock_shift_s:+g}")
            shift = {
                "LD_PRELOAD": str(clock_shift_library()),
                "CHORDBEAT_CLOCK_SHIFT_FILE": str(self._clock_file(port)),
            }
            env = {**os.environ, **shift}
        self.servers[port] = subprocess.Popen(argv, stdout=subprocess.DEVNULL, env=env)
        wait_for(self.client(port).ping, 10, what=f"redis-server on {port} to answer")
        return port

    def _sentinel(self, primary: int) -> int:
        port = free_port()
        home = self.dir / f"sentinel-{port}"
        home.mkdir()
        config = home / "sentinel.conf"
        config.write_text(
            f"port {port}\nbind {' '.join(self._binds())}\nprotected-mode {self._protected()}\n"
            f"dir {home}\nlogfile {home / 'log'}\n"
            f"sentinel monitor {self.master} {self.address} {primary} {QUORUM}\n"
            f"sentinel down-after-milliseconds {self.master} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {self.master} {FAILOVER_TIMEOUT_MS}\n"
        )
        self.sentinels[port] = subprocess.Popen([_binary("redis-sentinel"), str(config)], stdout=subprocess.DEVNULL)
        wait_for(self.client(port).ping, 10, what=f"redis-sentinel on {port} to answer")
        return port

    def _clock_file(self, port: int) -> Path:
        return self.dir / f"redis-{port}" / "clock-shift"

    def shift_clock(self, port: int, shift_s: float) -> None:
        """Step the clock of the server on ``port`` to ``shift_s`` seconds off this host's (it was
        started with ``steppable_clocks``, or shifted), and wait until its ``TIME`` says so."""
        partial = self._clock_file(port).with_suffix(".tmp")
        partial.write_text(f"{shift_s:+g}")
        partial.replace(self._clock_file(port))
        self.clock_shifts[port] = shift_s

        def shifted() -> bool:
            seconds, micros = self.client(port).time()
            return abs(seconds + micros / 1e6 - time.time() - shift_s) < 0.5

        wait_for(shifted, 5, interval=0.05, what=f"the clock of {port} to read {shift_s:+g}s")

    def _binds(self) -> list[str]:
        return sorted({"127.0.0.1", self.address})

    def _protected(self) -> str:
        # Protected mode (no password) refuses every client but loopback ones: the lab's hosts.
        return "yes" if self.address == "127.0.0.1" else "no"

    def _ready(self) -> bool:
        for port in self.sentinels:
            state = self.client(port).sentinel_master(self.master)
            if state["num-other-sentinels"] < SENTINELS - 1 or state["num-slaves"] < 1:
                return False
        return True

    @staticmethod
    def client(port: int) -> redis.Redis:
        return redis.Redis(port=port, decode_responses=True, socket_timeout=2, socket_connect_timeout=2)

    def primary(self) -> int:
        """The primary's port, as the first Sentinel that answers names it."""
        for port in self.sentinels:
            try:
                _host, primary = self.client(port).sentinel_get_master_addr_by_name(self.master)
                return int(primary)
            except redis.RedisError:
                continue
        raise AssertionError("no Sentinel answers")

    def kill_primary(self) -> int:
        """SIGKILL the primary (it stays dead); its port."""
        port = self.primary()
        self.servers[port].send_signal(signal.SIGKILL)
        self.servers[port].wait(10)
        return port

    def revive(self, port: int) -> None:
        """Start the server on ``port`` again, as a replica of the current primary, and wait until
        every Sentinel counts it as a healthy replica (one a failover may promote)."""
        primary = self.primary()
        self._server(replica_of=primary, port=port, clock_shift_s=self.clock_shifts.get(port, 0.0))
        self.wait_healthy_replica(port)

    def wait_healthy_replica(self, port: int) -> None:
        """Wait until every Sentinel counts ``port`` as a healthy replica (one a failover may promote)."""

        def healthy() -> bool:
            for sentinel in self.sentinels:
                replicas = self.client(sentinel).sentinel_slaves(self.master)
                if not any(
                    r["port"] == port
                    and r["master-link-status"] == "ok"
                    and not (r["is_sdown"] or r["is_disconnected"])
                    for r in replicas
                ):
                    return False
            return True

        wait_for(healthy, 30, interval=0.1, what=f"the Sentinels to count {port} as a healthy replica")

    def force_failover(self) -> int:
        """``SENTINEL FAILOVER``: the replica is promoted, the primary demoted; the old primary's port."""
        port = self.primary()
        self.client(next(iter(self.sentinels))).execute_command("SENTINEL", "FAILOVER", self.master)
        return port

    def wait_promoted(self, old: int, timeout: float = 30) -> int:
        """Wait until every Sentinel names a new primary that takes writes; its port."""

        def promoted() -> int | None:
            named = {int(self.client(p).sentinel_get_master_addr_by_name(self.master)[1]) for p in self.sentinels}
            if len(named) != 1 or old in named:
                return None
            (port,) = named
            return port if self.client(port).info("replication")["role"] == "master" else None

        found = wait_for(promoted, timeout, interval=0.05, what="a new primary")
        assert isinstance(found, int)
        return found

    def demote_now(self, port: int) -> None:
        """What the Sentinels do to a failed-over primary that is still up, without waiting for
        their next look at it (up to 10 s, during which it still takes its clients' writes): it
        follows the new primary, and its clients are disconnected, to ask the Sentinels again.

        In one transaction, as the Sentinels send it: a client blocked in ``BRPOP`` (a Celery
        worker) then sees its connection closed. Sent apart, it first reads ``UNBLOCKED … (master
        -> replica?)``, an error kombu does not take for a connection's, and the worker exits."""
        new_primary = self.primary()
        demote = self.client(port).pipeline(transaction=True)
        demote.replicaof(self.address, new_primary)
        demote.client_kill_filter(_type="normal")
        demote.execute()

    def close(self) -> None:
        for proc in [*self.sentinels.values(), *self.servers.values()]:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


class Forwarder:
    """A loopback port whose new connections go to :attr:`target`: a DNS name or virtual IP. Moved
    (:meth:`point_to`), it leaves the connections already made where they were, as a VIP does."""

    def __init__(self, target: int) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="forwarder").start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def point_to(self, target: int) -> None:
        self.target = target

    def _accept(self) -> None:
        while not self._closed:
            try:
                inbound, _ = self._listener.accept()
            except OSError:
                return
            try:
                outbound = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                inbound.close()
                continue
            outbound.settimeout(None)
            self._sockets += [inbound, outbound]
            for source, sink in ((inbound, outbound), (outbound, inbound)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True, name="forwarder-pump").start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        for sock in self._sockets:
            sock.close()
