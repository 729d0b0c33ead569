"""Fault injection for the chaos suite: a seeded fault plan and the cluster it is played against.

A plan is a list of faults at offsets from the start of the load, one after another (a fault ends
before the next begins; their effects may last longer: a SIGKILLed beat's lock lives 30 s).
The same seed, length and fault kinds always give the same plan; ``CHORDBEAT_CHAOS_SEED``
replays one.

Fault kinds and what they do:

- ``worker_kill``: SIGKILL a worker's process group (main process and pool children), restart the
  same node name after the fault's duration (as a supervisor would).
- ``worker_stop``: SIGSTOP a worker's process group for the duration, then SIGCONT (a frozen VM
  or a long GC pause; beyond the 3 s heartbeat TTL its steps are re-queued while it sleeps).
- ``beat_kill`` / ``beat_stop``: the same for the beat process.
- ``redis_restart_data``: graceful Redis stop (SIGTERM, the append-only file is synced), down for
  the duration, started again on the same port from its data.
- ``redis_restart_empty``: the same, but started from an empty directory (a failover to an empty
  replica, or a lost volume).
- ``db_outage``: PostgreSQL stopped with ``pg_ctl -m fast`` (connections dropped) for the duration,
  then started on the same port. SQLite: another connection holds ``BEGIN EXCLUSIVE`` for the
  duration (a backup or a stuck admin session; chmod means nothing to a root test run and a
  renamed file makes every new connection create an empty database). With WAL, readers go on and
  writers wait up to the busy timeout (30 s), so on SQLite this is a stall, not an error, unless
  the lock outlives the busy timeout (``db_outage_long``, long plans only).
- ``db_outage_long``: a database outage of 31-36 s (past SQLite's busy timeout).
- ``clock_skew``: a worker's or beat's host clock steps 35-120 s ahead or behind (as when NTP
  steps a drifted clock, or breaks) for the duration, then back: every process of the cluster runs
  under libfaketime reading its offset from a file of its own (``FAKETIME_TIMESTAMP_FILE``, read
  again every second). Nothing may notice: it excuses no missed slot and no stall.
- ``partition``, ``partition_one_way``, ``sentinel_failover``: the multi-host lab's (:mod:`tests.support.chaos_lab`).
- ``pgbouncer_restart``: the PgBouncer in front of PostgreSQL (transaction pooling) SIGKILLed, every
  client connection cut whatever it was doing, a commit on its way included; started again on the
  same port after the duration. Only a database behind PgBouncer draws it (test_chaos.py's plan
  through PgBouncer).

Every process that exits without being told to (a worker crashing on a Redis outage, say) is
recorded as an unexpected exit and restarted two seconds later, as systemd's ``Restart=always``
would, so the remaining invariants are still checked. A pool process dying while its worker lives
on (Celery replaces it) is recorded with when the supervisor saw it gone: the step it ran stopped
then, and a step log ``start`` it left without an ``end`` is not a body running on.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from celery import Celery

from celeryapp.config import Settings
from tests.support import processes
from tests.support.servers import PgBouncer, PostgresServer, RedisServer

WORKER_KINDS = ("worker_kill", "worker_stop")
BEAT_KINDS = ("beat_kill", "beat_stop")
REDIS_KINDS = ("redis_restart_data", "redis_restart_empty")
DB_KINDS = ("db_outage", "db_outage_long")
CLOCK_KINDS = ("clock_skew",)
FAULT_KINDS = WORKER_KINDS + BEAT_KINDS + REDIS_KINDS + DB_KINDS + CLOCK_KINDS
PARTITION_KINDS, FAILOVER_KINDS = ("partition", "partition_one_way"), ("sentinel_failover",)
#: Kinds only a cluster of the multi-host lab (:class:`tests.support.chaos_lab.LabCluster`) can inject.
LAB_KINDS = PARTITION_KINDS + FAILOVER_KINDS
#: Kinds only a database behind PgBouncer can inject.
POOLER_KINDS = ("pgbouncer_restart",)
#: Kinds a default (short) plan draws from; long plans add ``db_outage_long``.
SHORT_PLAN_KINDS = WORKER_KINDS + BEAT_KINDS + REDIS_KINDS + ("db_outage",) + CLOCK_KINDS
#: How far a ``clock_skew`` fault steps a clock, either way (seconds).
SKEW_S = (35, 120)

#: Seconds a fault lasts (down time before restart, or stop time before SIGCONT): (min, max).
DURATIONS_S = {
    "worker_kill": (0.5, 4.0),
    "worker_stop": (1.0, 8.0),
    "beat_kill": (0.5, 3.0),
    "beat_stop": (1.0, 8.0),
    "redis_restart_data": (1.0, 6.0),
    "redis_restart_empty": (1.0, 6.0),
    "db_outage": (2.0, 8.0),
    "db_outage_long": (31.0, 36.0),
    "clock_skew": (5.0, 20.0),
    "partition": (2.0, 15.0),
    "partition_one_way": (2.0, 15.0),
    "sentinel_failover": (2.0, 8.0),  # a SIGKILLed primary's time down (at least until the promotion)
    "pgbouncer_restart": (0.5, 4.0),
}
#: Relative frequency of each kind in a plan.
WEIGHTS = {
    "worker_kill": 3,
    "worker_stop": 3,
    "beat_kill": 1,
    "beat_stop": 1,
    "redis_restart_data": 1,
    "redis_restart_empty": 1,
    "db_outage": 2,
    "db_outage_long": 1,
    "clock_skew": 2,
    "partition": 2,
    "partition_one_way": 2,
    "sentinel_failover": 2,
    "pgbouncer_restart": 3,
}
#: Seconds of load before the first fault, and between two faults: (min, max).
WARMUP_S = 6.0
GAP_S = (1.0, 5.0)
#: Seconds a crashed process stays down before the supervisor restarts it.
RESTART_DELAY_S = 2.0


@dataclass(frozen=True)
class Fault:
    at_s: float
    kind: str
    target: str
    duration_s: float
    #: ``clock_skew``: seconds the target's clock steps (negative: behind).
    offset_s: int = 0
    #: Partitions: ``both``, ``inbound`` or ``outbound``; ``sentinel_failover``: ``sigkill`` or ``sentinel-failover``.
    how: str = ""

    def describe(self) -> str:
        killed = f"SIGKILL of the Redis primary, back as a replica after {self.duration_s:.1f}s"
        what = {
            "worker_kill": f"SIGKILL worker {self.target}, restart after {self.duration_s:.1f}s",
            "worker_stop": f"SIGSTOP worker {self.target} for {self.duration_s:.1f}s, then SIGCONT",
            "beat_kill": f"SIGKILL beat, restart after {self.duration_s:.1f}s",
            "beat_stop": f"SIGSTOP beat for {self.duration_s:.1f}s, then SIGCONT",
            "redis_restart_data": f"Redis graceful stop, down {self.duration_s:.1f}s, start from its data",
            "redis_restart_empty": f"Redis graceful stop, down {self.duration_s:.1f}s, start empty",
            "db_outage": f"database unavailable for {self.duration_s:.1f}s",
            "db_outage_long": f"database unavailable for {self.duration_s:.1f}s (past SQLite's busy timeout)",
            "clock_skew": f"{self.target}'s clock {self.offset_s:+d}s for {self.duration_s:.1f}s, then right",
            "partition": f"host {self.target} cut off both ways for {self.duration_s:.1f}s, then healed",
            "partition_one_way": f"host {self.target} cut off ({self.how} dropped) for {self.duration_s:.1f}s",
            "sentinel_failover": killed if self.how == "sigkill" else "SENTINEL FAILOVER: the replica promoted",
            "pgbouncer_restart": f"SIGKILL PgBouncer, restart after {self.duration_s:.1f}s",
        }[self.kind]
        return f"+{self.at_s:6.1f}s  {self.kind:<20} {what}"


def make_plan(
    seed: int, seconds: float, kinds: tuple[str, ...], workers: tuple[str, ...], first: str | None = None
) -> list[Fault]:
    """Faults one after another from ``WARMUP_S`` until ``seconds``; the same inputs, the same plan.
    ``first`` (one of ``kinds``): the first fault's kind, so that a plan has at least one."""
    if not kinds:
        return []
    rng = random.Random(seed)
    weights = [WEIGHTS[k] for k in kinds]
    faults: list[Fault] = []
    t = WARMUP_S
    while True:
        t += rng.uniform(*GAP_S)
        kind = rng.choices(kinds, weights)[0]
        if first in kinds and not faults:
            kind = first
        duration = round(rng.uniform(*DURATIONS_S[kind]), 1)
        if t + duration > seconds:
            return faults
        offset, how = 0, ""
        if kind in CLOCK_KINDS:
            target = rng.choice((*workers, "beat"))
            offset = rng.choice((-1, 1)) * rng.randint(*SKEW_S)
        elif kind in PARTITION_KINDS:
            target = rng.choice((*workers, "beat"))
            how = "both" if kind == "partition" else rng.choice(("inbound", "outbound"))
        elif kind in FAILOVER_KINDS:
            target, how = "redis", rng.choice(("sigkill", "sentinel-failover"))
        else:
            target = rng.choice(workers) if kind in WORKER_KINDS else kind.split("_")[0]
        faults.append(Fault(round(t, 1), kind, target, duration, offset, how))
        t += duration


def plan_text(faults: list[Fault]) -> str:
    return "\n".join(f"  {f.describe()}" for f in faults) or "  (no faults)"


@dataclass
class Applied:
    """A fault as it happened, in wall-clock epoch seconds."""

    fault: Fault
    started: float
    ended: float = 0.0
    #: Main pid of the worker or beat a kill or stop hit (the step log's ``ppid``).
    pid: int | None = None

    def as_json(self) -> dict[str, Any]:
        return {"fault": self.fault.describe(), "started": self.started, "ended": self.ended}


@dataclass
class Exit:
    """A process that exited without being told to."""

    name: str
    pid: int
    code: int | None
    at: float
    log_tail: str


class Database:
    """Makes the test's database unavailable and available again; ``pooler``: the PgBouncer the
    URL goes through, for ``pgbouncer_restart``."""

    def __init__(
        self,
        url: str,
        postgres: PostgresServer | None = None,
        sqlite_path: Path | None = None,
        pooler: PgBouncer | None = None,
    ) -> None:
        self.url = url
        self._postgres = postgres
        self._sqlite_path = sqlite_path
        self._lock: sqlite3.Connection | None = None
        self.pooler = pooler

    @property
    def kind(self) -> str:
        return "postgresql" if self._postgres is not None else "sqlite"

    def down(self) -> None:
        if self._postgres is not None:
            self._postgres.stop_server("fast")
        else:
            assert self._sqlite_path is not None
            # Waits for a writer that holds the lock now, like any other writer would.
            self._lock = sqlite3.connect(self._sqlite_path, timeout=60, isolation_level=None)
            self._lock.execute("BEGIN EXCLUSIVE")

    def up(self) -> None:
        if self._postgres is not None:
            self._postgres.start_server()
        elif self._lock is not None:
            self._lock.execute("ROLLBACK")
            self._lock.close()
            self._lock = None


@dataclass
class Cluster:
    """Subprocess workers and one beat against one Redis and one database, with a supervisor."""

    settings: Settings
    tmp: Path
    #: None on Sentinels (:class:`tests.support.chaos_lab.LabCluster`), which draws no ``REDIS_KINDS``.
    redis: RedisServer | None
    database: Database
    worker_names: tuple[str, ...] = ("w1", "w2")
    concurrency: int = 2
    applied: list[Applied] = field(default_factory=list)
    exits: list[Exit] = field(default_factory=list)
    #: Main pid of each SIGKILLed or crashed process -> when it died (its steps stop then).
    deaths: dict[int, float] = field(default_factory=dict)
    #: Pid of each pool process that died while its worker lived on (Celery replaces it) -> when
    #: the supervisor saw it gone: its step stopped then, though no main process died. A list: pids
    #: wrap at 32768 here, and a later pool process may have the pid of one that died.
    pool_deaths: dict[int, list[float]] = field(default_factory=dict)
    #: Pool processes at the supervisor's last look -> their worker's main pid.
    _pools: dict[int, int] = field(default_factory=dict)
    _procs: dict[str, processes.Process] = field(default_factory=dict)
    #: Processes the harness took down on purpose; the supervisor leaves them alone.
    _held: set[str] = field(default_factory=set)
    _crashed_at: dict[str, float] = field(default_factory=dict)
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    # --- processes ------------------------------------------------------------------------------

    def _clock_file(self, name: str) -> Path:
        return self.tmp / f"clock-{name}"

    def _clock_env(self, name: str) -> dict[str, str]:
        clock = self._clock_file(name)
        if not clock.exists():
            clock.write_text("+0s\n")
        return processes.steppable_clock(clock)

    def _spawn(self, name: str, *, append: bool) -> processes.Process:
        env = self._clock_env(name)
        if name == "beat":
            return processes.start_beat(self.settings, self.tmp, "beat", append=append, env=env)
        return processes.start_worker(self.settings, self.tmp, name, self.concurrency, append=append, env=env)

    def start(self) -> None:
        for name in (*self.worker_names, "beat"):
            self._procs[name] = self._spawn(name, append=False)
        self._thread = threading.Thread(target=self._supervise, name="chaos-supervisor", daemon=True)
        self._thread.start()

    def _supervise(self) -> None:
        while not self._stop.wait(0.25):
            with self._lock:
                self._watch_pools()
                for name, proc in self._procs.items():
                    if name in self._held or proc.running:
                        continue
                    now = time.time()
                    if name not in self._crashed_at:
                        self._crashed_at[name] = now
                        self.deaths.setdefault(proc.pid, now)
                        tail = proc.output()[-3000:]
                        self.exits.append(Exit(name, proc.pid, proc.proc.returncode, now, tail))
                    elif now - self._crashed_at[name] >= RESTART_DELAY_S:
                        del self._crashed_at[name]
                        self._procs[name] = self._spawn(name, append=True)

    def _watch_pools(self) -> None:
        """Note each pool process gone since the last look, and when (at most a look late: the
        body counts as running until then)."""
        now = time.time()
        workers = [self._procs[name] for name in self.worker_names if name in self._procs]
        # A worker that died took its pool with it: its own death is on record.
        living = {proc.pid for proc in workers if proc.running}
        pools = pool_processes(living)
        for child, worker in self._pools.items():
            if child not in pools and worker in living:
                self.pool_deaths.setdefault(child, []).append(now)
        self._pools = pools

    def process(self, name: str) -> processes.Process:
        with self._lock:
            return self._procs[name]

    def pids(self) -> dict[str, int]:
        with self._lock:
            return {name: proc.pid for name, proc in self._procs.items()}

    def shutdown(self) -> None:
        """Stop the supervisor, wake anything stopped, stop every process gracefully."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            for proc in self._procs.values():
                with contextlib.suppress(ProcessLookupError):
                    proc.signal_group(signal.SIGCONT)
            for name in ("beat", *self.worker_names):
                if name in self._procs:
                    self._procs[name].stop()

    def stop_beat(self) -> None:
        with self._lock:
            self._held.add("beat")
            proc = self._procs["beat"]
            proc.signal_group(signal.SIGCONT)
            proc.stop()

    # --- faults ---------------------------------------------------------------------------------

    def inject(self, fault: Fault, sleep: Callable[[float], None] = time.sleep) -> Applied:
        """Apply ``fault`` and undo it after its duration; returns when the system is whole again."""
        applied = Applied(fault, started=time.time())
        self.applied.append(applied)
        kind, target, duration = fault.kind, fault.target, fault.duration_s
        if kind in ("worker_kill", "beat_kill"):
            with self._lock:
                self._held.add(target)
                victim = self._procs[target]
                applied.pid = victim.pid
                applied.started = time.time()
                victim.kill()
                self.deaths[victim.pid] = applied.started
            sleep(duration)
            with self._lock:
                self._procs[target] = self._spawn(target, append=True)
                self._held.discard(target)
        elif kind in ("worker_stop", "beat_stop"):
            with self._lock:
                self._held.add(target)
                victim = self._procs[target]
                applied.pid = victim.pid
                applied.started = time.time()
                victim.signal_group(signal.SIGSTOP)
            sleep(duration)
            with self._lock:
                victim.signal_group(signal.SIGCONT)
                self._held.discard(target)
        elif kind in CLOCK_KINDS:
            clock = self._clock_file(target)
            clock.write_text(f"{fault.offset_s:+d}s\n")
            applied.started = time.time()
            sleep(duration)
            clock.write_text("+0s\n")
        elif kind in POOLER_KINDS:
            pooler = self.database.pooler
            assert pooler is not None, "only a database behind PgBouncer draws its restarts"
            pooler.stop()
            applied.started = time.time()
            sleep(duration)
            pooler.start()
        elif kind in REDIS_KINDS:
            assert self.redis is not None, "a cluster on Sentinels draws no Redis restarts"
            self.redis.terminate()
            applied.started = time.time()
            if kind == "redis_restart_empty":
                self.redis.clear_data()
            sleep(duration)
            self.redis.start()
        else:
            self.database.down()
            applied.started = time.time()
            sleep(duration)
            self.database.up()
        applied.ended = time.time()
        return applied

    def play(self, plan: list[Fault], started: float) -> None:
        """Inject each fault at its offset from ``started`` (epoch seconds)."""
        for fault in plan:
            delay = started + fault.at_s - time.time()
            if delay > 0:
                time.sleep(delay)  # the plan's clock, not a synchronisation
            self.inject(fault)


def pool_processes(parents: set[int]) -> dict[int, int]:
    """The live processes whose parent is one of ``parents``: pid -> parent pid (a zombie has
    exited, its parent frozen or not yet reaping it)."""
    found: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            # "pid (name) S ppid ...": the name may hold spaces and parentheses.
            state, ppid = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue  # gone meanwhile
        if int(ppid) in parents and state not in ("Z", "X"):
            found[int(entry)] = int(ppid)
    return found


def harness_client(settings: Settings) -> Celery:
    """What the harness uses to apply and pause schedules: plain Celery, like another service."""
    client = Celery("chaos-harness", broker=settings.broker_url, backend=settings.result_backend, set_as_current=False)
    client.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        # master_name: read only when a URL is a Sentinel list (the lab's cluster).
        broker_transport_options={"master_name": settings.sentinel_master},
        result_backend_transport_options={
            "retry_policy": {"max_retries": 1, "interval_start": 0, "interval_step": 0.1},
            "master_name": settings.sentinel_master,
        },
    )
    return client


@contextlib.contextmanager
def running(cluster: Cluster) -> Iterator[Cluster]:
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.shutdown()
