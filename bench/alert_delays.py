"""Alert delays with the default settings: from the fact to a real webhook receiver getting it.

A failed run (the fact: the run's ``completed_at``, the database's time), a finish deadline that
passes while the run is still going (the fact: slot + ``finish_within``; the deadline watch runs
every ``CHORDBEAT_ALERT_WATCH_INTERVAL``, 10 s) and the ``resolved`` that follows when that run
ends; and a receiver that answers 500 for 30 s: how long after it is back the alert arrives. One
worker on every queue (so it holds the sender's lease), beat, PostgreSQL, all on this host.
"""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import datetime
from functools import partial
from typing import Any

from sqlalchemy import Engine, select

from bench.harness import Bench, poll, running, trigger
from models import ScheduleExecution
from tests.support.receivers import HttpReceiver, Request, serve_http_receiver

#: The receiver is on loopback, over http://: the channel says so.
CHANNELS = (
    "channels:\n"
    "  bench-hook: {kind: webhook, url_env: BENCH_ALERT_URL, secret_env: BENCH_ALERT_SECRET, insecure: true}\n"
)
ON_FAILURE = {"channels": ["bench-hook"], "on": ["failed"]}
ON_LATE = {"channels": ["bench-hook"], "on": ["late"]}
FAIL = {"name": "fail", "task": "chordbeat.examples.fail", "kwargs": {"message": "bench"}}
#: Longer than the finish deadline plus a watch interval, shorter than the interval between slots.
SLOW = {"name": "slow", "task": "chordbeat.examples.sleep", "kwargs": {"seconds": 16}}
SLOT_EVERY_S = 30
FINISH_WITHIN_S = 2
#: How long the receiver refuses (answers 500) in the outage run.
OUTAGE_S = 30


def _received(hook: HttpReceiver, kind: str, nth: int = 0, **fields: Any) -> Request | None:
    """The ``nth`` (from 0) alert of ``kind`` with ``fields`` the receiver accepted."""
    found = [
        request
        for request in hook.answered(200)
        if request.json().get("kind") == kind and all(request.json().get(k) == v for k, v in fields.items())
    ]
    return found[nth] if len(found) > nth else None


def _completed_at(observer: Engine, execution_id: int) -> float | None:
    with observer.connect() as conn:
        done = conn.scalar(select(ScheduleExecution.completed_at).where(ScheduleExecution.id == execution_id))
    return done.timestamp() if done else None


def runs(bench: Bench, redis_db: int = 2) -> list[dict[str, float]]:
    url = bench.fresh_database()
    channels = bench.tmp / "alert-channels.yaml"
    channels.write_text(CHANNELS)
    settings = replace(bench.settings(url, redis_db), alert_channels_file=str(channels))
    observer = bench.observe(url)
    results: list[dict[str, float]] = []
    with serve_http_receiver() as hook:
        env = bench.env(settings) | {
            "CHORDBEAT_ALERT_CHANNELS": str(channels),
            "BENCH_ALERT_URL": hook.url,
            "BENCH_ALERT_SECRET": "bench",
        }
        with running(bench.worker(settings, "alerts", env=env)), bench.client(settings) as client:
            bench.wait_for_worker(client)
            client.apply_schedule({"name": "fails", "every": 86400, "steps": [[FAIL]], "alerts": ON_FAILURE})
            for _ in range(bench.runs):
                execution = trigger(client, "fails")
                got = poll(partial(_received, hook, "failed", execution_id=execution), 60, "the failed alert")
                done = poll(partial(_completed_at, observer, execution), 10, "the run's end")
                results.append({"alert_failed_s": got.received_at - done})
            with running(bench.beat(settings, "alerts-beat", env=env)):
                client.apply_schedule(
                    {
                        "name": "slow",
                        "every": SLOT_EVERY_S,
                        "steps": [[SLOW]],
                        "deadlines": {"finish_within": FINISH_WITHIN_S},
                        "alerts": ON_LATE,
                    }
                )
                for n in range(bench.runs):
                    late = poll(partial(_received, hook, "late", n, detail="finish"), 120, "a late alert")
                    results[n] |= _late_delays(hook, observer, late)
                client.pause_schedule("slow", reason="the benchmark measured it")
            hook.fail_next = 10**6
            refused_from = time.time()
            execution = trigger(client, "fails")
            poll(lambda: time.time() - refused_from >= OUTAGE_S or None, OUTAGE_S + 5, "the outage", interval=1)
            hook.fail_next, back = 0, time.time()
            got = poll(partial(_received, hook, "failed", execution_id=execution), 900, "the alert after the outage")
            results[0] |= {
                "alert_after_outage_s": got.received_at - back,
                "alert_outage_attempts": float(len([r for r in hook.answered(500) if r.received_at >= refused_from])),
            }
    bench.flush_redis(redis_db)
    return results


def _late_delays(hook: HttpReceiver, observer: Engine, late: Request) -> dict[str, float]:
    body = late.json()
    deadline = datetime.fromisoformat(body["slot"].replace("Z", "+00:00")).timestamp() + FINISH_WITHIN_S
    resolved = poll(partial(_received, hook, "resolved", execution_id=body["execution_id"]), 120, "resolved")
    ended = poll(partial(_completed_at, observer, body["execution_id"]), 10, "the late run's end")
    return {"alert_late_s": late.received_at - deadline, "alert_resolved_s": resolved.received_at - ended}
