"""The chaos cluster on several hosts: each worker and beat in a host of the multi-host lab
(:mod:`tests.support.lab`), Redis a Sentinel group (:mod:`tests.support.sentinel`) on the lab's bridge.

It injects every kind of :mod:`tests.support.chaos` but the Redis restarts (a Sentinel group is not one
server), and the lab's own kinds (:data:`tests.support.chaos.LAB_KINDS`):

- ``partition``: one host (a worker's or beat's) cut off from the servers both ways (nftables
  drops in its namespace: no reset, no error) for 2-15 s, then healed.
- ``partition_one_way``: the same, one direction drawn by the seed: ``outbound`` (nothing it
  sends arrives) or ``inbound`` (what it sends arrives, the answers do not: its writes land
  unacknowledged).
- ``sentinel_failover``: drawn by the seed, ``sigkill`` (the primary SIGKILLed; once the
  Sentinels promoted the replica, and not before the fault's duration, it is started again as a
  replica) or ``sentinel-failover`` (``SENTINEL FAILOVER``: the replica promoted, the primary
  demoted). The fault ends when every Sentinel names the new primary and it takes writes: the
  measured recovery counts from there. The next fault waits until the old primary is a healthy
  replica again (a failover needs one).

  The replica's host clock is off the primary's by :func:`replica_clock_shift_s` (20 or 60 s,
  ahead or behind, drawn by the plan's seed; :mod:`tests.support.sentinel` preloads tests/support/clock_shift.c
  into it, and each server keeps its clock when started again). Each failover thus moves Redis's
  clock, the reference, by the shift, and back at the next: keys expire by the new primary's
  clock (a heartbeat at once, ahead), and every process reads the jump. The primary-change grace
  (:mod:`celeryapp.recovery.heartbeat_trust`) and the reference-clock correction
  (:mod:`celeryapp.clock_correction`) are what keep the windows below.

Windows (:mod:`tests.support.chaos_invariants`) and why, with the cluster's heartbeat TTL of 3 s and
recovery every second:

- A cut-off beat fires nothing (there is one beat, no standby: every slot due meanwhile is
  missed, as with ``beat_stop``) and fires no recovery pass. Blackout and stall: 30 s after the
  heal. A command sent into the cut is answered only when TCP's retransmission, backing off
  exponentially (12.8 s apart after 15 s), gets through, or the client's socket timeout gives up
  and reconnects: 10 s for chordbeat's own clients (RedBeat's lock and entries), 30 s for kombu's
  (the fire messages beat publishes). 30 s bounds both.
- A cut-off worker's steps are stopped by its lease and re-queued by recovery to the other
  worker while the cut lasts: stall 10 s after the heal (the TTL, a recovery pass, and the
  attempt's delivery, as for ``worker_stop``). It excuses no slot: the other worker fires, and a
  fire message the cut-off one held is re-sent by recovery. A body it completed but could not
  record is fenced (it cannot say so), as a frozen worker's.
- A Sentinel failover: from the SIGKILL to the promotion nothing can be written (about 3 s:
  :data:`tests.support.sentinel.DOWN_AFTER_MS` and an election), and every client then asks the
  Sentinels for the new primary and reconnects. Blackout 10 s after the promotion (as a Redis
  restart from empty: writes the old primary had not replicated are lost); stall 15 s (a step's
  heartbeat refreshes did not reach Redis through the failover: its lease ends, it is re-queued
  after the TTL and a recovery pass, as after ``redis_restart_empty``).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from celeryapp.config import Settings
from tests.support import processes
from tests.support.chaos import FAILOVER_KINDS, PARTITION_KINDS, Applied, Cluster, Fault
from tests.support.lab import Host, Lab
from tests.support.sentinel import SentinelCluster

#: How far the replica's clock may be off the primary's (seconds; negative: behind). 20 s is
#: shorter than beat's 30 s lock, 60 s longer: ahead, the lock expires at once on the new primary.
REPLICA_SHIFTS_S = (-60, -20, 20, 60)


def replica_clock_shift_s(seed: int) -> int:
    """The replica's clock shift for the plan of ``seed``: the same seed, the same shift."""
    return random.Random(f"replica-clock:{seed}").choice(REPLICA_SHIFTS_S)


def sentinel_settings(sentinels: SentinelCluster, database_url: str, health_dir: str) -> Settings:
    """The chaos cluster's settings on a Sentinel group: a 3 s heartbeat TTL and recovery every
    second, as the windows above assume."""
    return Settings(
        broker_url=sentinels.url,
        result_backend=sentinels.url,
        redbeat_url=sentinels.url,
        sentinel_master=sentinels.master,
        database_url=database_url,
        heartbeat_ttl_s=3,
        recovery_interval_s=1,
        health_dir=health_dir,
        task_modules=("tests.support.chaos_tasks",),
    )


@dataclass
class FailoverCluster(Cluster):
    """A :class:`tests.support.chaos.Cluster` whose Redis is a Sentinel group: it injects
    ``sentinel_failover`` (its processes on this host, as they are; :class:`LabCluster` puts them
    in hosts of their own)."""

    sentinels: SentinelCluster | None = None

    def inject(self, fault: Fault, sleep: Callable[[float], None] = time.sleep) -> Applied:
        if fault.kind not in FAILOVER_KINDS:
            return super().inject(fault, sleep)
        assert self.sentinels is not None
        applied = Applied(fault, started=time.time())
        self.applied.append(applied)
        if fault.how == "sigkill":
            old = self.sentinels.kill_primary()
            applied.started = time.time()
            self.sentinels.wait_promoted(old)
            applied.ended = time.time()
            sleep(max(0.0, applied.started + fault.duration_s - time.time()))
            self.sentinels.revive(old)
        else:
            old = self.sentinels.force_failover()
            applied.started = time.time()
            self.sentinels.wait_promoted(old)
            applied.ended = time.time()
            self.sentinels.wait_healthy_replica(old)
        return applied


@dataclass
class LabCluster(FailoverCluster):
    """A :class:`FailoverCluster` whose workers and beat each run in their own lab host."""

    lab: Lab | None = None
    hosts: dict[str, Host] = field(default_factory=dict)

    def start(self) -> None:
        assert self.lab is not None and self.sentinels is not None
        for name in (*self.worker_names, "beat"):
            self.hosts[name] = self.lab.add_host(name)
        super().start()

    def _spawn(self, name: str, *, append: bool) -> processes.Process:
        env = processes.settings_env(self.settings, **self._clock_env(name))
        beat = name == "beat"
        argv = processes.beat_argv(self.tmp, name) if beat else processes.worker_argv(name, self.concurrency)
        return self.hosts[name].start(argv, env, self.tmp / f"{name}.log", append=append)

    def inject(self, fault: Fault, sleep: Callable[[float], None] = time.sleep) -> Applied:
        if fault.kind not in PARTITION_KINDS:
            return super().inject(fault, sleep)
        assert self.lab is not None
        applied = Applied(fault, started=time.time())
        self.applied.append(applied)
        host = self.hosts[fault.target]
        # The main pid of what runs there: the step log's ppid of its bodies.
        applied.pid = self.process(fault.target).pid
        self.lab.cut(host, fault.how)
        applied.started = time.time()
        sleep(fault.duration_s)
        self.lab.heal(host)
        applied.ended = time.time()
        return applied
