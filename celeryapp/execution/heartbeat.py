"""The watch kept beside a running step: heartbeat key refresh and cancel-flag polling.

One thread per process (and Redis client) watches every step running there, in one pipelined
round trip a poll for all of them, instead of a thread and its round trips per step: starting
and ending a thread, and deleting the step's keys, cost a no-op step about 0.2 ms of CPU. The
thread ends once it has nothing left to watch or delete, so an idle worker wakes for nothing.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from types import TracebackType
from typing import Any

import redis

from celeryapp.errors import StepCancelled

logger = logging.getLogger(__name__)

#: Seconds between two looks at the cancel flag; also bounds how fast a cancel stops a step.
CANCEL_POLL_S = 0.5


def _text(value: object) -> str | None:
    return value.decode(errors="replace") if isinstance(value, bytes) else None if value is None else str(value)


def _interrupt(thread_id: int) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(StepCancelled))


class StepWatch:
    """Keeps ``heartbeat_key`` alive while a step runs and interrupts the step when it must stop:
    its execution was cancelled, its timeout passed, or recovery gave its attempt up (``fenced_key``).

    The interrupt is :class:`StepCancelled` raised inside the step's thread; it lands at the next
    Python bytecode, so a step blocked in a long C call stops when that call returns. The heartbeat
    goes on until the watch is left, after the step has returned and its outcome is recorded: a
    step that unwinds slowly after the interrupt is still running, and one whose outcome waits for
    the database has not ended; neither must look like a lost worker whose attempt recovery runs
    again. Once :meth:`disarm` is called (the step's code returned) nothing interrupts any more.

    A watch without ``cancel_key`` only keeps its key alive (a claim's pickup lease).
    """

    def __init__(
        self,
        client: redis.Redis,
        *,
        heartbeat_key: str,
        cancel_key: str | None,
        fenced_key: str | None = None,
        stop_key: str | None = None,
        ttl_s: float,
        timeout_s: float | None = None,
        done_keys: tuple[str, ...] = (),
    ) -> None:
        self.client = client
        self._heartbeat_key = heartbeat_key
        self._flag_keys = tuple(k for k in (cancel_key, fenced_key) if k is not None)
        self._stop_key = stop_key
        self._deadline = time.monotonic() + timeout_s if timeout_s else None
        #: Deleted once the step has returned (by the watching thread, at its next poll).
        self.done_keys = (heartbeat_key, *done_keys)
        self._ttl_ms = int(ttl_s * 1000)
        self._refresh_s = ttl_s / 3
        self._last_beat = 0.0
        self._target = threading.get_ident()
        self._armed = False
        self._lock = threading.Lock()
        #: Interrupted: only the heartbeat is kept until the step has returned.
        self._fired = False
        self.cancelled = False
        self.timed_out = False
        self.fenced = False
        #: Why an operator stopped the attempt (Flower's Terminate or Revoke), if one did.
        self.stopped: str | None = None

    @classmethod
    def keep_alive(cls, client: redis.Redis, key: str, ttl_s: float) -> StepWatch:
        """A watch that only refreshes ``key`` (first at the next poll) and deletes it when left."""
        return cls(client, heartbeat_key=key, cancel_key=None, ttl_s=ttl_s)

    def __enter__(self) -> StepWatch:
        if self._flag_keys:
            self._first_beat()
            self._armed = True
        _watch(self)
        return self

    def _first_beat(self) -> None:
        try:
            with self.client.pipeline(transaction=False) as pipe:
                # The first heartbeat and the look at the operator's stop flag share a round trip.
                pipe.set(self._heartbeat_key, "1", px=self._ttl_ms)
                if self._stop_key is not None:
                    pipe.get(self._stop_key)
                answers = pipe.execute()
        except redis.RedisError as exc:
            # The watching thread writes it at its next poll.
            logger.warning("heartbeat %s not refreshed: %s", self._heartbeat_key, exc)
        else:
            self._last_beat = time.monotonic()
            if self._stop_key is not None:
                self.stopped = _text(answers[1])

    def disarm(self) -> None:
        """Called when the step's code has returned: no interrupt may land after this."""
        with self._lock:
            self._armed = False

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # The step's keys are deleted at the watching thread's next poll, with those of every step
        # that ended meanwhile: the runner goes on without waiting for a round trip.
        self.disarm()
        _unwatch(self)

    # What the watching thread asks of each watch: its part of a poll's pipeline, then the answers.

    def refresh_due(self, now: float) -> bool:
        return now - self._last_beat >= self._refresh_s

    def queue_refresh(self, pipe: Any) -> None:
        pipe.set(self._heartbeat_key, "1", px=self._ttl_ms)

    def refreshed(self, now: float) -> None:
        self._last_beat = now

    def wants_look(self, now: float) -> bool:
        """Whether this poll looks at the flags; a step past its timeout is interrupted instead
        (also in thread pools and inside code that swallows the soft time limit)."""
        if self._fired or not self._flag_keys:
            return False
        if self._deadline is not None and now >= self._deadline:
            self._fire("timed_out")
            return False
        return True

    def queue_look(self, pipe: Any) -> int:
        for key in self._flag_keys:
            pipe.exists(key)
        if self._stop_key is not None:
            pipe.get(self._stop_key)
        return len(self._flag_keys) + (self._stop_key is not None)

    def answer(self, replies: list[Any]) -> None:
        """The look's replies, in the order :meth:`queue_look` asked."""
        cancelled, *rest = replies
        stopped = rest.pop() if self._stop_key is not None else None
        if rest and rest[0]:
            self._fire("fenced")
        elif cancelled:
            self._fire("cancelled")
        elif stopped is not None:
            self.stopped = _text(stopped)
            self._fire("stopped_by_operator")

    def _fire(self, why: str) -> None:
        self._fired = True
        with self._lock:
            if self._armed:
                if why != "stopped_by_operator":
                    setattr(self, why, True)
                self._armed = False
                _interrupt(self._target)


class _Watcher:
    """The thread watching every step of one process that uses one Redis client."""

    def __init__(self, client: redis.Redis, key: tuple[int, int]) -> None:
        self.client = client
        self.key = key
        self.watches: dict[StepWatch, None] = {}  # insertion-ordered set
        self.doomed: list[str] = []
        self.thread = threading.Thread(target=self._run, name="chordbeat-step-watch", daemon=True)

    def _run(self) -> None:
        while True:
            time.sleep(CANCEL_POLL_S)
            with _lock:
                if not self.watches and not self.doomed:
                    del _watchers[self.key]
                    return
                watches, doomed = list(self.watches), self.doomed
                self.doomed = []
            try:
                self._poll(watches, doomed)
            except Exception:
                # Whatever went wrong, the thread must go on: without it no heartbeat of this
                # process is refreshed, and every step running longer than a TTL would be re-run.
                logger.exception("step watch: a poll failed; the next one is in %ss", CANCEL_POLL_S)

    def _poll(self, watches: list[StepWatch], doomed: list[str]) -> None:
        now = time.monotonic()
        refreshing = [w for w in watches if w.refresh_due(now)]
        looking = [w for w in watches if w.wants_look(now)]
        try:
            with self.client.pipeline(transaction=False) as pipe:
                for watch in refreshing:
                    watch.queue_refresh(pipe)
                sizes = [watch.queue_look(pipe) for watch in looking]
                if doomed:
                    pipe.delete(*doomed)
                replies = pipe.execute()
        except redis.RedisError as exc:
            # A failed refresh is tried again at the next poll, not a period later, so the keys are
            # back as soon as Redis is. Finished steps' keys are left to expire (a heartbeat's TTL).
            logger.warning("step watch: Redis did not answer (%s); tried again at the next poll", exc)
            return
        for watch in refreshing:
            replies.pop(0)
            watch.refreshed(now)
        if time.monotonic() - now > CANCEL_POLL_S:
            # The look outlasted a poll: the process was frozen (SIGSTOP, a VM pause) or Redis
            # stalled meanwhile, and the answers may be from before the freeze, when recovery had
            # not yet fenced an attempt. Look again now, not a poll later.
            self._look_again(looking)
            return
        for watch, size in zip(looking, sizes, strict=True):
            watch.answer(replies[:size])
            del replies[:size]

    def _look_again(self, looking: list[StepWatch]) -> None:
        try:
            with self.client.pipeline(transaction=False) as pipe:
                sizes = [watch.queue_look(pipe) for watch in looking]
                replies = pipe.execute()
        except redis.RedisError:
            return
        for watch, size in zip(looking, sizes, strict=True):
            watch.answer(replies[:size])
            del replies[:size]


_lock = threading.Lock()
_watchers: dict[tuple[int, int], _Watcher] = {}


def _watch(watch: StepWatch) -> None:
    key = (os.getpid(), id(watch.client))
    with _lock:
        watcher = _watchers.get(key)
        if watcher is None:
            watcher = _watchers[key] = _Watcher(watch.client, key)
            watcher.thread.start()
        watcher.watches[watch] = None


def _unwatch(watch: StepWatch) -> None:
    with _lock:
        # Still there: a watcher only leaves once it has nothing to watch.
        watcher = _watchers[(os.getpid(), id(watch.client))]
        watcher.watches.pop(watch, None)
        watcher.doomed.extend(watch.done_keys)


def _forget_parents_watchers() -> None:
    # A forked child has none of its parent's threads (and maybe a lock held by one of them).
    global _lock
    _lock = threading.Lock()
    _watchers.clear()


os.register_at_fork(after_in_child=_forget_parents_watchers)
