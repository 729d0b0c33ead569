"""A multi-host lab on one machine: hosts are Linux network namespaces on a bridge.

Each host is a network namespace with one veth into a bridge in the root namespace, where Redis
and PostgreSQL listen on the bridge's address (besides 127.0.0.1, for the test process). A host
runs our processes (``ip netns exec``), and can be cut off: both ways or one way (nftables rules
in the host's own namespace, dropping what goes to or comes from the servers), or unplugged (its
veth's bridge end set down). Addresses come from a private /24 that no route of this machine
overlaps, live only on interfaces the lab created, and nothing routes them anywhere: no host has
a default route, and the root namespace forwards nothing to them.

Everything is named after the test run (``cb<pid>``), and deleted in teardown, also after a
failure: processes inside the namespaces first, then the namespaces, then the bridge.

Needs root, ``ip`` (iproute2) and ``nft`` (nftables); CI runs as root and ``make test`` installs
them. Without them, the fixtures skip, saying why.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import os
import random
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from celeryapp.config import Settings
from models.migrate import upgrade
from models.session import dispose_all
from tests.support import processes
from tests.support.servers import PostgresServer, RedisServer

#: Where the lab's /24 is drawn from (the second and third octets at random).
LAB_RANGE = ipaddress.IPv4Network("10.0.0.0/8")
#: Name of the nftables table a cut adds in a host's namespace.
CUT_TABLE = "chordbeat_cut"
_numbers = itertools.count(1)


def missing() -> str | None:
    """Why the lab cannot run here, or None."""
    if os.geteuid() != 0:
        return "the multi-host lab needs root (network namespaces); CI runs it as root"
    for tool, package in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            return f"the multi-host lab needs `{tool}` (Debian's {package}; make test installs it)"
    return None


def _run(*argv: str, stdin: str | None = None) -> str:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 of 10/8 that no route of the root namespace overlaps (another lab's, a VPN's...)."""
    taken = []
    for line in _run("ip", "-4", "route", "show", "table", "all").splitlines():
        word = line.split()[0] if line.split() else ""
        with contextlib.suppress(ValueError):
            taken.append(ipaddress.IPv4Network(word if word != "default" else "0.0.0.0/0", strict=False))
    candidates = [n for n in taken if n.prefixlen > 0]
    for _ in range(100):
        subnet = ipaddress.IPv4Network(f"10.{random.randint(100, 254)}.{random.randint(0, 255)}.0/24")
        if subnet.subnet_of(LAB_RANGE) and not any(subnet.overlaps(n) for n in candidates):
            return subnet
    raise RuntimeError("no free /24 in 10.0.0.0/8 for the lab")


@dataclass
class Host:
    """One host: a network namespace with its address on the lab's bridge."""

    name: str
    namespace: str
    address: str
    #: The veth's end on the bridge, in the root namespace.
    bridge_end: str
    #: What :meth:`start` started here.
    started: list[processes.Process] = field(default_factory=list)

    def start(self, argv: list[str], env: dict[str, str], log: Path, *, append: bool = False) -> processes.Process:
        """Run ``argv`` in this host's namespace (``ip netns exec`` execs it: same pid); ``append``:
        a restart writes on after its predecessor's log."""
        process = processes.Process(["ip", "netns", "exec", self.namespace, *argv], env, log, append=append)
        self.started.append(process)
        return process

    def run(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        """Run a short command in this host's namespace and wait for it."""
        return subprocess.run(
            ["ip", "netns", "exec", self.namespace, *argv], capture_output=True, text=True, check=False
        )

    def worker(
        self,
        settings: Settings,
        tmp: Path,
        name: str,
        concurrency: int = 1,
        queues: str | None = None,
        env: dict[str, str] | None = None,
    ) -> processes.Process:
        """A prefork worker named ``name@<host>``, as :func:`tests.support.processes.start_worker` starts one."""
        argv = processes.worker_argv(name, concurrency, queues=queues)
        return self.start(argv, processes.settings_env(settings, **(env or {})), tmp / f"{name}.log")

    def beat(self, settings: Settings, tmp: Path, name: str = "beat") -> processes.Process:
        return self.start(processes.beat_argv(tmp, name), processes.settings_env(settings), tmp / f"{name}.log")

    def stop_processes(self) -> None:
        """Warm shutdown of what this host runs, then SIGKILL of anything left in the namespace."""
        for process in self.started:
            with contextlib.suppress(Exception):
                process.stop()
        for pid in _run("ip", "netns", "pids", self.namespace).split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)


class Lab:
    """The bridge and its hosts; servers listen on :attr:`server_address`."""

    def __init__(self) -> None:
        self.tag = f"cb{os.getpid() % 100000}x{next(_numbers)}"
        self.bridge = f"{self.tag}br"
        self.subnet = _free_subnet()
        hosts = self.subnet.hosts()
        self.server_address = str(next(hosts))
        self._addresses = hosts
        self.hosts: dict[str, Host] = {}
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        try:
            _run("ip", "addr", "add", f"{self.server_address}/{self.subnet.prefixlen}", "dev", self.bridge)
            _run("ip", "link", "set", self.bridge, "up")
        except Exception:
            self.close()
            raise

    @property
    def server_interface(self) -> str:
        """The servers' address with the lab's prefix (``10.1.2.1/24``)."""
        return f"{self.server_address}/{self.subnet.prefixlen}"

    def add_host(self, name: str) -> Host:
        number = next(_numbers)
        namespace = f"{self.tag}-{name}"
        inside, bridge_end = f"{self.tag}h{number}", f"{self.tag}b{number}"
        host = Host(name, namespace, str(next(self._addresses)), bridge_end)
        self.hosts[name] = host
        _run("ip", "netns", "add", namespace)
        _run("ip", "link", "add", inside, "type", "veth", "peer", "name", bridge_end)
        _run("ip", "link", "set", bridge_end, "master", self.bridge)
        _run("ip", "link", "set", bridge_end, "up")
        _run("ip", "link", "set", inside, "netns", namespace)
        _run("ip", "-n", namespace, "link", "set", inside, "name", "eth0")
        _run("ip", "-n", namespace, "addr", "add", f"{host.address}/{self.subnet.prefixlen}", "dev", "eth0")
        _run("ip", "-n", namespace, "link", "set", "lo", "up")
        _run("ip", "-n", namespace, "link", "set", "eth0", "up")
        return host

    # Faults.

    def cut(self, host: Host, direction: str = "both") -> None:
        """Drop, in ``host``'s namespace, what it sends to the servers (``outbound``), what it
        receives from them (``inbound``), or both: no reset, no error, as behind a broken switch."""
        if direction not in ("both", "outbound", "inbound"):
            raise ValueError(f"direction: both, outbound or inbound, not {direction!r}")
        rules = [f"table inet {CUT_TABLE} {{"]
        if direction in ("both", "outbound"):
            rules.append(f"  chain out {{ type filter hook output priority 0; ip daddr {self.server_address} drop; }}")
        if direction in ("both", "inbound"):
            rules.append(f"  chain in {{ type filter hook input priority 0; ip saddr {self.server_address} drop; }}")
        rules.append("}")
        _run("ip", "netns", "exec", host.namespace, "nft", "-f", "-", stdin="\n".join(rules) + "\n")

    def unplug(self, host: Host) -> None:
        """The host's cable pulled at the bridge: nothing goes either way."""
        _run("ip", "link", "set", host.bridge_end, "down")

    def heal(self, host: Host) -> None:
        """Undo :meth:`cut` and :meth:`unplug`."""
        _run("ip", "link", "set", host.bridge_end, "up")
        with contextlib.suppress(RuntimeError):  # not cut
            _run("ip", "netns", "exec", host.namespace, "nft", "delete", "table", "inet", CUT_TABLE)

    def remove_hosts(self) -> None:
        """Processes first, then namespaces (their veths go with them); each step is tried
        whatever the ones before it did."""
        for host in self.hosts.values():
            with contextlib.suppress(Exception):
                host.stop_processes()
        for host in self.hosts.values():
            with contextlib.suppress(RuntimeError):
                _run("ip", "netns", "del", host.namespace)
            with contextlib.suppress(RuntimeError):  # gone with its namespace, unless the move failed
                _run("ip", "link", "del", host.bridge_end)
        self.hosts.clear()

    def close(self) -> None:
        self.remove_hosts()
        with contextlib.suppress(RuntimeError):
            _run("ip", "link", "del", self.bridge)


@dataclass
class LabServers:
    """Redis and PostgreSQL on the lab's bridge (and on 127.0.0.1)."""

    lab: Lab
    redis: RedisServer
    postgres: PostgresServer

    @property
    def redis_url(self) -> str:
        return f"redis://{self.lab.server_address}:{self.redis.port}/0"

    def database_url(self, name: str) -> str:
        return self.postgres.url(name, host=self.lab.server_address)


TEMPLATE_DB = "lab_template"


@pytest.fixture(scope="module")
def lab_servers() -> Iterator[LabServers]:
    """The bridge, and Redis and PostgreSQL listening on it, for a test module."""
    reason = missing()
    if reason is not None:
        pytest.skip(reason)
    lab = Lab()
    redis_server = RedisServer(also_bind=lab.server_address)
    postgres = PostgresServer(also_listen=lab.server_interface)
    try:
        redis_server.start()
        postgres.start()
        postgres.create_database(TEMPLATE_DB)
        upgrade(postgres.url(TEMPLATE_DB))
        dispose_all()
        yield LabServers(lab, redis_server, postgres)
    finally:
        redis_server.close()
        postgres.close()
        lab.close()


@pytest.fixture
def lab(lab_servers: LabServers) -> Iterator[Lab]:
    """The lab with no hosts yet; the hosts a test adds are deleted after it, whatever happened."""
    lab = lab_servers.lab
    try:
        yield lab
    finally:
        lab.remove_hosts()


@pytest.fixture
def lab_settings(lab_servers: LabServers, tmp_path: Path) -> Settings:
    """Settings of every process of a lab test: the servers at the bridge's address, a fresh
    database, an empty Redis, the short timings of the other crash tests."""
    name = f"lab_{os.getpid()}_{next(_numbers)}"
    lab_servers.postgres.create_database(name, template=TEMPLATE_DB)
    redis.Redis.from_url(lab_servers.redis_url).flushall()
    url = lab_servers.redis_url
    return Settings(
        broker_url=url,
        result_backend=url,
        redbeat_url=url,
        database_url=lab_servers.database_url(name),
        heartbeat_ttl_s=3,
        recovery_interval_s=1,
        health_dir=str(tmp_path),
    )
