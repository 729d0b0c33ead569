"""What every scenario stands on: its own Redis and PostgreSQL, fresh databases, real processes.

chordbeat's processes connect as the cluster's owner; the benchmark reads (polls, collects timings)
as a separate role, so ``pg_stat_statements`` counts what chordbeat itself sends.
"""

from __future__ import annotations

import gc
import os
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar, cast

from redis import Redis
from sqlalchemy import Engine, create_engine, text

from celeryapp.client import ChordbeatClient
from celeryapp.config import Settings
from models.migrate import upgrade
from models.session import dispose_all
from tests.support.processes import CELERY, ROOT, Process, settings_env, worker_argv
from tests.support.servers import PostgresServer, RedisServer, wait_for

T = TypeVar("T")
#: The benchmark's own role for reading results (not counted as chordbeat's statements).
OBSERVER = "bench_observer"
TEMPLATE = "bench_template"
LOG_LEVEL = "WARNING"


def _with_log_level(argv: list[str], level: str) -> list[str]:
    return [level if previous == "-l" else arg for previous, arg in zip(["", *argv], argv, strict=False)]


def _memory_mib(pid: int, file: str, field: str) -> float:
    """``field`` (kB) of ``/proc/<pid>/<file>``, summed over a process and its children (a worker
    and its pool), in MiB."""
    total_kib = 0
    for p in [pid, *children(pid)]:
        with suppress(FileNotFoundError, ProcessLookupError):
            for line in Path(f"/proc/{p}/{file}").read_text().splitlines():
                if line.startswith(field):
                    total_kib += int(line.split()[1])
    return total_kib / 1024


def rss_mib(pid: int) -> float:
    """Resident memory of a process and its children: pages shared between them (a prefork pool
    shares its parent's) count once in each."""
    return _memory_mib(pid, "status", "VmRSS:")


def pss_mib(pid: int) -> float:
    """Proportional set size of a process and its children: each shared page divided among the
    processes that map it, so what the pool shares with its parent counts once in the sum."""
    return _memory_mib(pid, "smaps_rollup", "Pss:")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in found]


def cpu_by_process(pids: Iterable[int]) -> dict[int, float]:
    """CPU seconds used so far by each process still there."""
    used = {}
    for pid in pids:
        with suppress(FileNotFoundError, ProcessLookupError):
            used[pid] = cpu_seconds(pid)
    return used


def cpu_used(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds the processes used between two readings (one that started meanwhile: all of it)."""
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())


@dataclass
class Bench:
    redis: RedisServer
    pg: PostgresServer
    tmp: Path
    runs: int
    quick: bool
    #: Schedules of the on-demand scale scenario (bench/scale.py).
    scale_schedules: int = 100_000
    _databases: int = 0
    _engines: dict[str, Engine] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- databases ---------------------------------------------------------------------------
    def admin(self) -> Engine:
        return self.engine(self.pg.url(), autocommit=True)

    def engine(self, url: str, *, autocommit: bool = False) -> Engine:
        key = f"{url}|{autocommit}"
        with self._lock:
            if key not in self._engines:
                options = {"isolation_level": "AUTOCOMMIT"} if autocommit else {}
                self._engines[key] = create_engine(url, pool_size=2, **options)  # type: ignore[arg-type]
            return self._engines[key]

    def fresh_database(self) -> str:
        """A new, migrated, empty database (copied from a template); chordbeat's URL to it."""
        with self._lock:
            self._databases += 1
            name = f"bench_{self._databases}"
        with self.admin().connect() as conn:
            conn.execute(text(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}"))
        return self.pg.url(name)

    def observer_url(self, url: str) -> str:
        return url.replace(f"//{self.pg.user}@", f"//{OBSERVER}@")

    def observe(self, url: str) -> Engine:
        """The benchmark's own connection to a database (as the observer role)."""
        return self.engine(self.observer_url(url))

    # -- Redis -----------------------------------------------------------------------------
    def redis_url(self, db: int = 0) -> str:
        """The benchmark's Redis; scenarios that run side by side use their own database number."""
        return self.redis.url.rsplit("/", 1)[0] + f"/{db}"

    def redis_pid(self) -> int:
        assert self.redis.proc is not None, "the benchmark's Redis is not running"
        return self.redis.proc.pid

    def redis_client(self, db: int = 0) -> Redis:
        return Redis.from_url(self.redis_url(db), decode_responses=True)

    def flush_redis(self, db: int = 0) -> None:
        self.redis_client(db).flushdb()

    # -- processes -------------------------------------------------------------------------
    def settings(self, url: str, redis_db: int = 0) -> Settings:
        health = self.tmp / "health"
        health.mkdir(mode=0o700, exist_ok=True)
        return Settings(
            broker_url=self.redis_url(redis_db),
            result_backend=self.redis_url(redis_db),
            redbeat_url=self.redis_url(redis_db),
            database_url=url,
            health_dir=str(health),
        )

    def env(self, settings: Settings) -> dict[str, str]:
        return settings_env(settings, PYTHONPATH=ROOT, BENCH_RAW_REDIS_URL=self.redis.url)

    def worker(self, settings: Settings, name: str = "w1", *, env: dict[str, str] | None = None) -> Process:
        """chordbeat's prefork worker (-c 2) on every queue, control first (``env``: instead of
        :meth:`env`'s)."""
        argv = _with_log_level(worker_argv(name, 2), LOG_LEVEL)
        return Process(argv, env or self.env(settings), self.tmp / f"{name}.log", append=True)

    def beat(
        self, settings: Settings, name: str = "beat", level: str = LOG_LEVEL, *, env: dict[str, str] | None = None
    ) -> Process:
        argv = [CELERY, "-A", "celeryapp", "beat", "-l", level, "--schedule", str(self.tmp / f"{name}-schedule")]
        return Process(argv, env or self.env(settings), self.tmp / f"{name}.log", append=True)

    def raw_worker(self, name: str = "raw") -> Process:
        argv = [CELERY, "-A", "bench.raw_app", "worker", "-l", LOG_LEVEL, "-P", "prefork", "-c", "2", "-Q", "raw"]
        argv += ["-n", f"{name}@%h", "--without-mingle", "--without-gossip"]
        return Process(argv, self.env(Settings()), self.tmp / f"{name}.log", append=True)

    def raw_beat(self, name: str = "raw-beat") -> Process:
        argv = [CELERY, "-A", "bench.raw_app", "beat", "-S", "redbeat.RedBeatScheduler", "-l", LOG_LEVEL]
        argv += ["--schedule", str(self.tmp / f"{name}-schedule")]
        return Process(argv, self.env(Settings()), self.tmp / f"{name}.log", append=True)

    def client(self, settings: Settings) -> ChordbeatClient:
        return ChordbeatClient(settings.broker_url, timeout_s=120)

    def wait_for_worker(self, client: ChordbeatClient) -> None:
        wait_for(lambda: client.list_schedules() is not None, 120, interval=0.2, what="a chordbeat worker")

    def beat_ticked_since(self, since: float) -> bool:
        """True once the beat holding the lock has ticked after ``since`` (its liveness file)."""
        path = self.tmp / "health" / "chordbeat-beat.health"
        try:
            return float(path.read_text()) > since
        except (OSError, ValueError):
            return False


def _execute(url: str, *statements: str) -> None:
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            for statement in statements:
                conn.execute(text(statement))
    finally:
        engine.dispose()


@contextmanager
def bench(runs: int, quick: bool) -> Iterator[Bench]:
    """Redis and a PostgreSQL cluster with ``pg_stat_statements``, torn down afterwards."""
    tmp = Path(tempfile.mkdtemp(prefix="chordbeat-bench-"))
    redis_server = RedisServer()
    pg = PostgresServer()
    redis_server.start()
    try:
        pg.start()
        _execute(pg.url(), "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        pg.stop_server()
        pg.start_server()
        _execute(pg.url(), f"CREATE ROLE {OBSERVER} LOGIN SUPERUSER", f"CREATE DATABASE {TEMPLATE}")
        upgrade(pg.url(TEMPLATE))
        _execute(pg.url(TEMPLATE), "CREATE EXTENSION pg_stat_statements")
        # Nothing may stay connected to the template: databases are copied from it.
        dispose_all()
        the_bench = Bench(redis_server, pg, tmp, runs, quick)
        try:
            yield the_bench
        finally:
            # Finalize pending results while Redis still answers (their finalizers would retry at exit).
            gc.collect()
            for engine in the_bench._engines.values():
                engine.dispose()
            dispose_all()
    finally:
        redis_server.close()
        pg.close()


@contextmanager
def running(*processes: Process) -> Iterator[None]:
    """Stop the processes (warm shutdown) when the block ends, last started first."""
    try:
        yield
    finally:
        for process in reversed(processes):
            process.stop()


def trigger(client: ChordbeatClient, name: str) -> int:
    """Start a run of ``name`` now; its execution id."""
    answer = client.trigger_schedule(name)
    execution_id = answer["execution_id"]
    if not isinstance(execution_id, int):
        raise RuntimeError(f"{name}: no run started ({answer})")
    return execution_id


def poll(predicate: Callable[[], T | None], timeout: float, what: str, interval: float = 0.1) -> T:
    """``wait_for`` a value: the first one ``predicate`` returns that is not None (or falsy)."""
    return cast(T, wait_for(predicate, timeout, interval=interval, what=what))
