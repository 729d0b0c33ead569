"""The database's word on running steps: an attempt the database no longer holds as running stops,
whatever Redis says.

A cancel, or recovery giving an attempt up, commits in the database and then sets a flag in Redis
that the step's watch reads every 0.5 s (:mod:`celeryapp.worker.heartbeat`). That write can fail
after the commit (Redis restarting, the cancelling process cut off from it, killed in between),
and a flag can be lost (Redis restarted empty, a failover to a replica whose clock runs ahead
expires it early): the step would then run on to its end, beside the run that ``cancel_previous``
started, or beside the attempt that replaced it. So a step that has run for an interval asks the
database whether its attempt is still the one running, and again every interval.

What it costs is per long step, not per step: a step shorter than the interval is never asked
about (an entry in a dictionary, in and out), the questions of all the process's steps due at once
go in one query on the worker tasks' primary key, and they are asked by a thread of their own, so
a database that does not answer delays neither a heartbeat nor a stop.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from sqlalchemy import select

from celeryapp.worker.heartbeat import Interrupt, StepWatch
from models import WorkerTask, WorkerTaskStatus
from models.session import autocommit

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class _Asked:
    watch: StepWatch
    database_url: str
    worker_task_id: int
    attempt: int
    every_s: float
    #: When to ask next (monotonic).
    due: float


def _verdicts(database_url: str, asked: list[_Asked]) -> list[Interrupt | None]:
    """Per step: ``None`` while its attempt is the one the database has running; else why it stops
    (its worker task moved on to another attempt: fenced; gone: its run ended, a cancel)."""
    ids = [a.worker_task_id for a in asked]
    with autocommit(database_url, read_only=True) as conn:
        rows = conn.execute(
            select(WorkerTask.id, WorkerTask.attempt, WorkerTask.status).where(WorkerTask.id.in_(ids))
        ).all()
    held = {(task_id, attempt) for task_id, attempt, status in rows if status == WorkerTaskStatus.PROCESSING}
    present = {task_id for task_id, _attempt, _status in rows}
    return [
        None
        if (a.worker_task_id, a.attempt) in held
        else Interrupt.FENCED
        if a.worker_task_id in present
        else Interrupt.CANCELLED
        for a in asked
    ]


def _ask(due: list[_Asked]) -> None:
    by_database: dict[str, list[_Asked]] = {}
    for one in due:
        by_database.setdefault(one.database_url, []).append(one)
    for database_url, asked in by_database.items():
        try:
            verdicts = _verdicts(database_url, asked)
        except Exception as exc:
            # The Redis flags still stop the steps; the database is asked again an interval later.
            logger.warning("running steps: the database did not answer whether they may go on: %s", exc)
            continue
        for one, why in zip(asked, verdicts, strict=True):
            if why is None or one.watch.interrupted is not None:
                continue
            one.watch.stop(why)
            if one.watch.interrupted is why:  # it was still at work
                logger.warning(
                    "worker task %s attempt %s: the database no longer has it running (%s); stopped",
                    one.worker_task_id,
                    one.attempt,
                    why.value,
                )


def _run() -> None:
    global _thread
    while True:
        with _lock:
            now = time.monotonic()
            if not _asked:
                _thread = None
                return
            due = [a for a in _asked if a.due <= now]
            if not due:
                _woken.wait(min(a.due for a in _asked) - now)
                continue
            for asked in due:
                asked.due = now + asked.every_s
        _ask(due)


@contextmanager
def asking_the_database(
    watch: StepWatch, *, database_url: str, worker_task_id: int, attempt: int, every_s: float
) -> Iterator[None]:
    """While the block runs, the step ``watch`` watches is stopped if, asked every ``every_s``
    (the first time ``every_s`` from now), the database no longer has its attempt running."""
    global _thread
    asked = _Asked(watch, database_url, worker_task_id, attempt, every_s, time.monotonic() + every_s)
    with _lock:
        _asked[asked] = None
        # A thread already waiting wakes no later than its earliest entry, and every entry waits
        # at least an interval: none is woken. A process running only short steps starts one at
        # most an interval.
        if _thread is None:
            _thread = threading.Thread(target=_run, name="chordbeat-attempt-check", daemon=True)
            _thread.start()
    try:
        yield
    finally:
        with _lock:
            _asked.pop(asked, None)


_lock = threading.Lock()
_woken = threading.Condition(_lock)
_asked: dict[_Asked, None] = {}  # insertion-ordered set
_thread: threading.Thread | None = None


def _forget_parents_thread() -> None:
    # A forked child has none of its parent's threads (and maybe a lock held by one of them).
    global _lock, _woken, _thread
    _lock = threading.Lock()
    _woken = threading.Condition(_lock)
    _thread = None
    _asked.clear()


os.register_at_fork(after_in_child=_forget_parents_thread)
