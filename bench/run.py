"""``make bench``: chordbeat and a raw Celery baseline, side by side, in one run.

    .venv/bin/python -m bench.run                 # everything, 3 runs each (13 minutes on 2 cores)
    .venv/bin/python -m bench.run --quick         # 1 run, 1,000 schedules: a smoke test (quick.json)
    .venv/bin/python -m bench.run --only pipelines,faults   # some scenarios (partial.json)
    .venv/bin/python -m bench.run --only scale --scale-schedules 100000   # on demand only (scale.json)

Starts its own Redis and PostgreSQL; chordbeat runs on PostgreSQL. Writes bench/results/latest.json
(medians; ``spread`` holds [min, max], ``runs`` every run's value, ``targets`` issue 10's targets)
and bench/results/latest.md, prints the table, and with ``--readme`` rewrites README's table.
``CHORDBEAT_BENCH_RUNS`` sets the number of runs (at least 3 for figures worth quoting).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

from sqlalchemy import text

from bench import alert_delays, backfill_cost, beat_scale, durable, faults, history, limits, pipelines, raw_app, scale
from bench.harness import Bench, bench
from bench.report import LATEST_JSON, LATEST_MD, evaluate, markdown, rewrite_readme, text_table
from bench.stats import combine

FAMILIES: dict[str, Callable[[Bench], list[dict[str, Any]]]] = {
    "pipelines": pipelines.chordbeat_runs,
    "raw_pipelines": pipelines.raw_runs,
    "durable": durable.runs,
    "staggered": beat_scale.staggered,
    "raw_staggered": beat_scale.raw_staggered,
    "burst": beat_scale.burst_runs,
    "faults": faults.runs,
    "history": history.history,
    "alerts": alert_delays.runs,
    "backfill": backfill_cost.runs,
    "limits": limits.runs,
    "scale": scale.runs,
}
#: Scenarios run only when named in ``--only`` (each writes its own results file).
ON_DEMAND = {"scale": "scale"}
DEFAULT = [family for family in FAMILIES if family not in ON_DEMAND]

NOTES = [
    "chordbeat: one prefork worker (-c 2) on all queues and one beat, PostgreSQL (fsync off) and Redis on loopback; "
    "raw Celery: a prefork worker (-c 2) with Celery's defaults and JSON, the same Redis, no database.",
    "Advance: last end of group g → first start of group g+1, from chordbeat's activity rows and from the times "
    "raw no-op tasks push to Redis (one RPUSH each, subtracted from raw's Redis commands). Under load, chordbeat's "
    "100 executions are triggered one after another through the client (service calls the same worker serves), "
    "raw Celery's 100 chords from one task inside its worker; steps/s is steps / (last end - first start).",
    "Fire lateness: execution created - nominal slot for schedules `every: 60` whose first slots are spread over "
    "a minute (anchors in milliseconds); a slot that started nothing because it was taken after the next slot was "
    "due (superseded) counts from when it was recorded, and the share of slots that ran is shown. Each run is one "
    "16.7 s window of that one minute (5 s after the first slot), so the runs share one setup; beat CPU is "
    "measured over the same window. Raw RedBeat's entries are due in whole seconds (its best case), scored as "
    "after their first run (RedBeat 2.4 scores a fresh entry up to an interval early, and its beat would reload "
    "it every tick until due), and publish to a queue nobody consumes.",
    "All due at once: from the common slot until every schedule's slot was processed (its execution created, or "
    "recorded as superseded), a fresh database per run; raw RedBeat: until the last message is in the queue. "
    "Each schedule has one no-op step, run by the same worker meanwhile.",
    "Requeue: two workers; SIGKILL of the one running a step → the step's next attempt started, default TTL 15 s "
    "and recovery interval 10 s (once recovery trusts heartbeats: its first pass after a start waits one TTL); "
    "the killed worker is replaced under another name afterwards. Failover: SIGKILL of the beat "
    "holding the lock → first execution created by the standby (a schedule `every: 1`).",
    "Statements and round trips per step: pg_stat_statements for chordbeat's role during the loaded run "
    "(triggering, advancement, recovery and beat included), divided by the steps run; round trips are the "
    "statements with BEGIN, COMMIT and ROLLBACK (a multi-row upsert's rows count one each); the benchmark reads as "
    "another role. CPU per step: user + system time of each group of processes during the loaded run (from "
    "/proc), divided by the steps run: the worker with its pool processes (and chordbeat's beat), PostgreSQL's "
    "processes but the benchmark's own connections, Redis. Redis bytes kept per step: used memory after the "
    "loaded run less before, per step (results "
    "kept for result_expires, 24 h). Redis bytes per schedule: its RedBeat entry.",
    "Alerts: a webhook receiver in the benchmark's process, one worker on every queue (the sender's lease holder), "
    "default settings (sender poll 1 s, deadline watch every 10 s). Failed: the run's completed_at (database "
    "time) → the receiver has the request. Late: slot + finish_within (2 s, a 16 s step) → received; resolved: "
    "that run's end → received. Outage: the receiver answers 500 for 30 s; the alert arrives this long after it "
    "answers again (backoff 5 s doubling), attempts counted during the outage.",
    "Backfill: a schedule (cron every minute, overlap allow, one no-op step) backfilled over 1,000 minutes with "
    "max_concurrent 10, on PostgreSQL and on SQLite: request → the backfill completed; statements are those "
    "chordbeat's engine sent meanwhile (an SQLAlchemy listener; the worker is Celery's test worker, 12 threads, in "
    "the benchmark's process), per slot.",
    "Limits: one worker and beat on PostgreSQL, a limit of 1. Admit: 200 runs of one no-op step that uses it "
    "wait while a long step holds it; that step's run is cancelled and the waiters run one after another: one's "
    "completed_at → the next one's started_at (activity rows). Unrelated start: a run's trigger (its started_at) "
    "→ its first step started, of a schedule using no limit, 20 times while the limit is held with the 200 "
    "waiting and 20 times before with no limit busy (a long step using no limit then occupies the same pool "
    "process), the ratio of the medians. Cycles: no worker; a limit of 10,000 slots keyed by customer, one per "
    "key, 9,998 keys held; 2 processes each acquire a new key and release it (a transaction each, "
    "limit_slots called directly) for 10 s: cycles per second, both together.",
    "Durable: the loaded run again on a second PostgreSQL at its defaults (fsync, synchronous_commit and "
    "full_page_writes on; the others run with them off), reached through PgBouncer 1.18 in transaction pooling "
    "(pool of 20); CPU per step counted as above, PgBouncer's with PostgreSQL's.",
    "Worker memory after the loaded run, the worker and its pool processes summed: RSS (VmRSS, which counts "
    "a page the pool shares with its parent once in each process) and PSS (smaps_rollup's Pss, each shared page "
    "divided among the processes mapping it: what the worker costs the machine).",
]


def _versions(the_bench: Bench) -> dict[str, str]:
    with the_bench.admin().connect() as conn:
        postgres = str(conn.execute(text("SHOW server_version")).scalar())
    return {
        "python": platform.python_version(),
        "celery": version("celery"),
        "kombu": version("kombu"),
        "celery-redbeat": version("celery-redbeat"),
        "redis-server": str(the_bench.redis_client().info("server")["redis_version"]),
        "postgresql": postgres,
    }


def _collect(per_run: dict[str, list[Any]], results: list[dict[str, Any]]) -> None:
    for run in results:
        for key, value in run.items():
            per_run.setdefault(key, []).append(value)


def summarise(per_run: dict[str, list[Any]], meta: dict[str, Any]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    spread: dict[str, Any] = {}
    for key, values in per_run.items():
        results[key], spread[key] = combine(values)
    results["spread"] = spread
    results["runs"] = per_run
    results["targets"] = evaluate(results)
    results["meta"] = meta
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 run and 1,000 schedules (a smoke test)")
    parser.add_argument("--runs", type=int, default=int(os.environ.get("CHORDBEAT_BENCH_RUNS", "3")))
    parser.add_argument("--only", default=",".join(DEFAULT), help="comma-separated: " + ", ".join(FAMILIES))
    parser.add_argument(
        "--scale-schedules", type=int, default=None, help="schedules of --only scale (100,000; --quick: 1,000)"
    )
    parser.add_argument("--readme", action="store_true", help="rewrite README.md's performance table")
    args = parser.parse_args(argv)
    families = [f.strip() for f in args.only.split(",") if f.strip()]
    unknown = set(families) - set(FAMILIES)
    if unknown or not families:
        parser.error(f"--only: unknown {sorted(unknown)}; choose from {', '.join(FAMILIES)}")
    runs = 1 if args.quick else max(1, args.runs)
    started = time.monotonic()
    per_run: dict[str, list[Any]] = {}
    failed: dict[str, str] = {}
    with bench(runs, args.quick) as the_bench:
        the_bench.scale_schedules = args.scale_schedules or (1000 if args.quick else 100_000)
        raw_app.configure(the_bench.redis.url)
        meta = {
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "runs": runs,
            "quick": args.quick,
            "schedules": the_bench.scale_schedules if families == ["scale"] else beat_scale.schedule_count(the_bench),
            "families": families,
            "failed": failed,
            "cpus": os.cpu_count(),
            "duration_s": 0,
            "versions": _versions(the_bench),
            "notes": NOTES,
        }
        for family in families:
            began = time.monotonic()
            try:
                _collect(per_run, FAMILIES[family](the_bench))
            except Exception as exc:
                # One broken scenario must not throw away the minutes the others took.
                traceback.print_exc()
                failed[family] = f"{type(exc).__name__}: {exc}"
            print(f"bench: {family} done in {time.monotonic() - began:.0f} s", file=sys.stderr, flush=True)
            meta["duration_s"] = round(time.monotonic() - started)
            results = summarise(per_run, meta)
            _write(results, args.quick, families)  # after each family: an interrupted run keeps what it measured
    print(text_table(results))
    written, _ = _outputs(args.quick, families)
    print(f"\n{written} (and .md) written; {meta['duration_s']} s in all")
    if failed:
        print(f"FAILED: {failed}; the processes' logs are in {the_bench.tmp}", file=sys.stderr)
        return 1
    shutil.rmtree(the_bench.tmp, ignore_errors=True)
    if args.readme and written.name == "scale.json" and LATEST_JSON.exists():
        rewrite_readme(json.loads(LATEST_JSON.read_text()))  # the main table as it was, this run's below
    elif args.readme and written != LATEST_JSON:
        print("README.md left alone: a quick or partial run's figures are not for quoting")
    elif args.readme:
        rewrite_readme(results)
    return 0


def _outputs(quick: bool, families: list[str]) -> tuple[Path, Path]:
    """Only a full run (every scenario, every run) makes latest.json: a quick or partial run's figures
    are not for quoting and never replace it. An on-demand scenario run alone writes its own file."""
    if quick:
        name = "quick"
    elif len(families) == 1 and families[0] in ON_DEMAND:
        name = ON_DEMAND[families[0]]
    else:
        name = "latest" if set(families) == set(DEFAULT) else "partial"
    return LATEST_JSON.with_name(f"{name}.json"), LATEST_MD.with_name(f"{name}.md")


def _write(results: dict[str, Any], quick: bool, families: list[str]) -> None:
    json_path, md_path = _outputs(quick, families)
    json_path.parent.mkdir(exist_ok=True)
    json_path.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    md_path.write_text(markdown(results))


if __name__ == "__main__":
    sys.exit(main())
