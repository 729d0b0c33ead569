"""The raw Celery baseline: plain chords of no-op tasks and plain RedBeat, no database, no chordbeat.

    celery -A bench.raw_app worker -P prefork -c 2 -Q raw
    celery -A bench.raw_app beat -S redbeat.RedBeatScheduler

Configured from ``BENCH_RAW_REDIS_URL`` (broker, results and RedBeat on the same Redis as chordbeat's
runs). Celery's defaults otherwise, JSON only. A no-op task records its own start and end with one
``RPUSH`` (the only cost beyond raw Celery, about 0.1 ms); a chord's body dispatches the next group,
from inside the worker as chordbeat's advancement does.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery, chord

REDIS_URL = os.environ.get("BENCH_RAW_REDIS_URL", "redis://127.0.0.1:6379/0")
QUEUE = "raw"
#: Redis list of ``[pipeline, group, start, end]`` records, one per no-op task.
TIMES_KEY = "raw:times"
#: Task RedBeat's entries send (never consumed while beat is measured: publishing is what counts).
TICK_TASK = "raw.tick"

app = Celery("raw", broker=REDIS_URL, backend=REDIS_URL, set_as_current=False)
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    result_accept_content=["json"],
    task_default_queue=QUEUE,
    timezone="UTC",
    enable_utc=True,
    # The same beat loop and lock settings as chordbeat's beat (celeryapp/application.py).
    beat_max_loop_interval=5,
    redbeat_redis_url=REDIS_URL,
    redbeat_key_prefix="raw:redbeat:",
    redbeat_lock_timeout=30,
)

_times: redis.Redis | None = None


def configure(redis_url: str) -> None:
    """Point this process's raw app at ``redis_url`` (the benchmark's, before it connects)."""
    global REDIS_URL
    REDIS_URL = redis_url
    app.conf.update(broker_url=redis_url, result_backend=redis_url, redbeat_redis_url=redis_url)


def _record(pipeline: int, group: int, start: float, end: float) -> None:
    global _times
    if _times is None:
        _times = redis.Redis.from_url(REDIS_URL)
    _times.rpush(TIMES_KEY, json.dumps([pipeline, group, start, end]))


@app.task(name="raw.noop")
def noop(pipeline: int, group: int) -> None:
    start = time.time()
    _record(pipeline, group, start, time.time())


def start_group(pipeline: int, group: int, groups: int, width: int) -> None:
    header = [noop.si(pipeline, group) for _ in range(width)]
    chord(header)(advance.si(pipeline, group + 1, groups, width))


@app.task(name="raw.advance")
def advance(pipeline: int, group: int, groups: int, width: int) -> None:
    """The chord body: start the next group, if any."""
    if group < groups:
        start_group(pipeline, group, groups, width)


@app.task(name="raw.launch")
def launch(pipelines: int, groups: int, width: int) -> None:
    """Start ``pipelines`` pipelines at once, from inside the worker (no result subscriptions)."""
    for pipeline in range(pipelines):
        start_group(pipeline, 0, groups, width)


@app.task(name=TICK_TASK)
def tick(*_: Any) -> None:
    """What a raw RedBeat entry sends."""
