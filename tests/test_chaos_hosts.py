"""Chaos across hosts: the chaos suite's load and invariants (:mod:`tests.support.chaos_run`,
:mod:`tests.support.chaos_invariants`) with each worker and beat in a host of its own (a network
namespace of :mod:`tests.support.lab`), Redis a Sentinel group (primary, replica, three Sentinels on the
lab's bridge) and PostgreSQL on the bridge; the plan adds partitions (both ways, one way) and
Sentinel failovers (:mod:`tests.support.chaos_lab`) to the worker, beat, database and clock faults. The
replica runs on a clock 20 or 60 s ahead or behind (drawn by the seed, printed with the plan), so
each failover also makes Redis's clock, the reference, jump.

PostgreSQL only: processes on several hosts share a server database (SQLite is a file on one
host). The short plan (60 s, one plan) includes ``db_outage_long``; ``CHORDBEAT_CHAOS_LONG=1``
runs three of 300 s. Other knobs: :mod:`tests.support.chaos_run`. ``pytest -s`` shows the plan, per fault
kind how many were injected and the time from each one's end to the first step body starting,
and the violations; they are also in ``chaos-hosts-report.json`` in the test's temporary directory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.support.chaos import BEAT_KINDS, CLOCK_KINDS, DB_KINDS, LAB_KINDS, WORKER_KINDS, Database
from tests.support.chaos_lab import LabCluster, replica_clock_shift_s, sentinel_settings
from tests.support.chaos_run import (
    OVERHEAD_S,
    PLANS,
    SECONDS,
    SETTLE_S,
    announced_plan,
    base_seed,
    fault_kinds,
    play_and_check,
    report,
)
from tests.support.lab import TEMPLATE_DB, LabServers, lab_servers  # noqa: F401  (fixture)
from tests.support.sentinel import SentinelCluster

pytestmark = pytest.mark.slow

#: Every kind a lab cluster injects (a Sentinel group is not one server: no Redis restarts); short
#: and long plans alike draw from all of them.
HOST_KINDS = WORKER_KINDS + BEAT_KINDS + DB_KINDS + CLOCK_KINDS + LAB_KINDS
SEED = base_seed()


def run_plan(servers: LabServers, index: int, seed: int, kinds: tuple[str, ...], root: Path) -> dict[str, Any]:
    tmp = root / f"plan-{index}"
    tmp.mkdir()
    workers = ("w1", "w2")
    plan = announced_plan("across hosts", index, seed, kinds, workers)
    shift_s = replica_clock_shift_s(seed)
    print(f"  the Redis replica's clock: {shift_s:+d}s (each failover moves Redis's clock by it, and back)")
    name = f"chaos_hosts_{os.getpid()}_{index}"
    servers.postgres.create_database(name, template=TEMPLATE_DB)
    database = Database(servers.database_url(name), postgres=servers.postgres)
    sentinels = SentinelCluster(address=servers.lab.server_address, replica_clock_shift_s=shift_s)
    sentinels.start()
    try:
        settings = sentinel_settings(sentinels, database.url, str(tmp))
        cluster = LabCluster(settings, tmp, None, database, worker_names=workers, lab=servers.lab, sentinels=sentinels)
        result = play_and_check(cluster, plan, tmp / "steps.jsonl", seed)
    finally:
        servers.lab.remove_hosts()
        sentinels.close()
    return {"database": "postgresql", "plan": index, "replica_clock_shift_s": shift_s, **result}


@pytest.mark.timeout(PLANS * (SECONDS + SETTLE_S + OVERHEAD_S) + 60)
def test_invariants_hold_across_hosts_under_a_seeded_fault_plan(
    lab_servers: LabServers,  # noqa: F811
    tmp_path: Path,
) -> None:
    """0 lost, 0 stuck, 0 concurrent double runs, 0 doubled slots, 0 completed steps run again,
    with hosts cut off, Redis failing over, PostgreSQL away for up to 36 s and clocks stepped."""
    kinds = fault_kinds(HOST_KINDS, HOST_KINDS)
    results = [run_plan(lab_servers, i, SEED + i, kinds, tmp_path) for i in range(PLANS)]
    report("chaos across hosts", SEED, results, tmp_path / "chaos-hosts-report.json")
