"""Steps/s and CPU a step with PostgreSQL at its durable defaults, through PgBouncer (issue 41).

The other scenarios' PostgreSQL runs with ``fsync``, ``synchronous_commit`` and
``full_page_writes`` off: a commit there costs no flush to disk. Here a second cluster runs with
PostgreSQL's defaults (every commit waits for its WAL flush) and chordbeat's worker and beat reach it
through PgBouncer in transaction pooling, as production does. The load is the pipelines scenario's
(100 pipelines of 5 groups of 2 no-op steps started at once); CPU is counted as there, PgBouncer's
with PostgreSQL's (the database group).
"""

from __future__ import annotations

from typing import Any

from bench.harness import OBSERVER, TEMPLATE, Bench, _execute, cpu_seconds, running
from bench.pipelines import ALONE, LOADED, CpuMeter, _run_chordbeat
from bench.stats import throughput
from models.migrate import upgrade
from models.session import dispose_all
from tests.support.servers import PgBouncer, PostgresServer


class DurablePostgres(PostgresServer):
    """A cluster at PostgreSQL's default durability: fsync, synchronous_commit, full_page_writes on."""

    def start_server(self) -> None:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c max_connections=200"
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.dir / "log"), "-w", "start")


def runs(bench: Bench) -> list[dict[str, Any]]:
    pg = DurablePostgres()
    bouncer = PgBouncer(pg)
    durable = Bench(bench.redis, pg, bench.tmp, bench.runs, bench.quick)
    results = []
    bench.flush_redis()
    try:
        pg.start()
        _execute(pg.url(), f"CREATE ROLE {OBSERVER} LOGIN SUPERUSER", f"CREATE DATABASE {TEMPLATE}")
        upgrade(pg.url(TEMPLATE))
        dispose_all()  # nothing may stay connected to the template
        bouncer.start()
        url = durable.fresh_database()
        settings = durable.settings(bouncer.url(url.rsplit("/", 1)[1]))
        observer = durable.observe(url)
        worker = durable.worker(settings, "durable")
        beat = durable.beat(settings, "durable-beat")
        with running(beat, worker), durable.client(settings) as client:
            durable.wait_for_worker(client)
            _run_chordbeat(durable, client, observer, "warm-up", ALONE)
            assert bouncer.proc is not None
            for n in range(bench.runs):
                bouncer_before = cpu_seconds(bouncer.proc.pid)
                with CpuMeter(durable, [worker.pid, beat.pid], observer) as cpu:
                    loaded = _run_chordbeat(durable, client, observer, f"loaded-{n}", LOADED)
                per_step = cpu.per_step(len(loaded))
                bouncer_ms = (cpu_seconds(bouncer.proc.pid) - bouncer_before) * 1000 / len(loaded)
                per_step["database"] += bouncer_ms
                per_step["all"] += bouncer_ms
                results.append({"durable_steps_per_s": throughput(loaded), "durable_cpu_ms_per_step": per_step})
    finally:
        for engine in durable._engines.values():
            engine.dispose()
        dispose_all()
        bouncer.close()
        pg.close()
        bench.flush_redis()
    return results
