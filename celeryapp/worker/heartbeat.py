"""The watch kept beside a running step: heartbeat key refresh, cancel-flag polling and the lease.

One thread per process (and Redis client) watches every step running there, in one pipelined
round trip a poll for all of them, instead of a thread and its round trips per step: starting
and ending a thread, and deleting the step's keys, were most of a no-op step's watch (the figures
are in docs/performance.md). The thread ends once it has nothing left to watch or delete, so an
idle worker wakes for nothing.

A second thread per process keeps time: it stops a step whose timeout passed, or whose lease ran
out (see :class:`StepWatch`). It never touches Redis, so a call the watching thread is stuck in
(a partition: no answer until the client's socket timeout, tried again) cannot delay a stop.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from enum import Enum
from functools import partial
from types import TracebackType
from typing import Any

import redis

from celeryapp.errors import StepCancelled
from celeryapp.messaging.redis_client import registered_script
from celeryapp.worker.lease import lease_s

logger = logging.getLogger(__name__)

#: Seconds between two reads of the cancel flag; also bounds how fast a cancel stops a step.
CANCEL_POLL_S = 0.5
#: Seconds the time-keeping thread sleeps at most: a step watched since may have an earlier deadline.
KEEPER_IDLE_S = 1.0
#: A step's first heartbeat (KEYS[1], ARGV[1] ms), the one it replaced (another runner's of this very
#: attempt: the database lost that claim) and its stop flag's read (KEYS[2]): one command, not three.
_FIRST_BEAT_LUA = "return {redis.call('SET', KEYS[1], '1', 'PX', ARGV[1], 'GET'), redis.call('GET', KEYS[2])}"


def _text(value: object) -> str | None:
    return value.decode(errors="replace") if isinstance(value, bytes) else None if value is None else str(value)


def _interrupt(thread_id: int) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(StepCancelled))


class Interrupt(Enum):
    """Why a watch interrupted its step (once at most)."""

    CANCELLED = "cancelled"  # its execution was cancelled
    FENCED = "fenced"  # recovery gave its attempt up
    STOPPED_BY_OPERATOR = "stopped by operator"  # Flower's Terminate or Revoke: ``stopped`` says which
    TIMED_OUT = "timed out"
    LEASE_LOST = "lease lost"  # the attempt is lost to this worker: recovery runs it again
    RUNNING_ELSEWHERE = "running elsewhere"  # another runner's heartbeat found: never started


class StepWatch:
    """Keeps ``heartbeat_key`` alive while a step runs and interrupts the step when it must stop:
    its execution was cancelled, its timeout passed, recovery gave its attempt up (``fenced_key``),
    or its lease ran out (:func:`lease_s`: no refresh reached Redis for that long, so recovery may
    soon re-queue the attempt elsewhere, and only a step stopped by then cannot run beside it).

    The interrupt is :class:`StepCancelled` raised inside the step's thread; it lands at the next
    Python bytecode, so a step blocked in a long C call stops when that call returns. The heartbeat
    goes on until the watch is left, after the step has returned and its outcome is recorded: a
    step that unwinds slowly after the interrupt is still running, and one whose outcome waits for
    the database has not ended; neither must look like a lost worker whose attempt recovery runs
    again. Once :meth:`disarm` is called (the step's code returned) nothing interrupts any more.

    ``since`` (monotonic) is when the claim was sent: the lease counts from it (recovery does), and a
    step entered after it ran out never starts. A watch without ``cancel_key`` only keeps a key alive.
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
        since: float | None = None,
    ) -> None:
        self.client = client
        self._heartbeat_key = heartbeat_key
        self._flag_keys = tuple(k for k in (cancel_key, fenced_key) if k is not None)
        self._stop_key = stop_key
        self._deadline = time.monotonic() + timeout_s if timeout_s else None
        #: Deleted once the step has returned (by the watching thread, at its next poll).
        self.done_keys = (heartbeat_key, *done_keys)
        self._ttl_ms = int(ttl_s * 1000)
        self.lease_s = lease_s(ttl_s)
        self._refresh_s = self.lease_s / 3
        #: When the last refresh Redis acknowledged was sent (monotonic).
        self._last_sent = time.monotonic() if since is None else since
        self._target = threading.get_ident()
        self._armed = False
        self._lock = threading.Lock()
        #: Interrupted: only the heartbeat is kept until the step has returned.
        self._fired = False
        #: Why the step was interrupted, if it was (``None`` also when the interrupt came too late).
        self.interrupted: Interrupt | None = None
        #: Why an operator stopped the attempt (Flower's Terminate or Revoke), if one did.
        self.stopped: str | None = None

    @property
    def cancelled(self) -> bool:
        return self.interrupted is Interrupt.CANCELLED

    @property
    def fenced(self) -> bool:
        return self.interrupted is Interrupt.FENCED

    @property
    def timed_out(self) -> bool:
        return self.interrupted is Interrupt.TIMED_OUT

    @property
    def lease_lost(self) -> bool:
        return self.interrupted is Interrupt.LEASE_LOST

    @classmethod
    def keep_alive(cls, client: redis.Redis, key: str, ttl_s: float) -> StepWatch:
        """A watch that only refreshes ``key`` (first at the next poll) and deletes it when left."""
        watch = cls(client, heartbeat_key=key, cancel_key=None, ttl_s=ttl_s)
        watch._last_sent = -ttl_s  # due at once: the key was written a moment ago, maybe longer
        return watch

    def __enter__(self) -> StepWatch:
        if self._flag_keys:
            self._first_beat()
            self._armed = self.interrupted is None
        _watch(self)
        return self

    def _first_beat(self) -> None:
        sent = time.monotonic()
        if sent - self._last_sent >= self.lease_s:
            # The process stood still since the claim (a SIGSTOP, a VM pause): recovery may run the
            # attempt elsewhere already, and a heartbeat now would hide that. It must not start.
            logger.warning("heartbeat %s: lease over before the step started; not started", self._heartbeat_key)
            self.interrupted = Interrupt.LEASE_LOST
            return
        try:
            if self._stop_key is None:
                self.client.set(self._heartbeat_key, "1", px=self._ttl_ms)
            else:
                # The first heartbeat and the read of the operator's stop flag: one command.
                first_beat = registered_script(self.client, _FIRST_BEAT_LUA)
                replaced, stopped = first_beat(keys=[self._heartbeat_key, self._stop_key], args=[self._ttl_ms])
                self.stopped = _text(stopped)
                if replaced is not None:  # left to its runner when this watch ends: not deleted
                    self.interrupted, self.done_keys = Interrupt.RUNNING_ELSEWHERE, self.done_keys[1:]
        except redis.RedisError as exc:
            # The watching thread writes it at its next poll; the lease counts from ``since``.
            logger.warning("heartbeat %s not refreshed: %s", self._heartbeat_key, exc)
        else:
            self._last_sent = sent

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
        self.check_time(now)  # a process that stood still past the lease: its step stops before a refresh hides it
        return now - self._last_sent >= self._refresh_s

    def queue_refresh(self, pipe: Any) -> None:
        pipe.set(self._heartbeat_key, "1", px=self._ttl_ms)

    def refreshed(self, sent: float) -> None:
        self._last_sent = max(self._last_sent, sent)

    def wants_flag_check(self) -> bool:
        return not self._fired and bool(self._flag_keys)

    def queue_flag_check(self, pipe: Any) -> int:
        for key in self._flag_keys:
            pipe.exists(key)
        if self._stop_key is not None:
            pipe.get(self._stop_key)
        return len(self._flag_keys) + (self._stop_key is not None)

    def answer(self, replies: list[Any]) -> None:
        """The flag check's replies, in the order :meth:`queue_flag_check` asked."""
        cancelled, *rest = replies
        stopped = rest.pop() if self._stop_key is not None else None
        if rest and rest[0]:
            self.stop(Interrupt.FENCED)
        elif cancelled:
            self.stop(Interrupt.CANCELLED)
        elif stopped is not None:
            self.stopped = _text(stopped)
            self.stop(Interrupt.STOPPED_BY_OPERATOR)

    # What the time-keeping thread asks.

    def check_time(self, now: float) -> float | None:
        """Interrupt the step if its timeout passed or its lease ran out; else the next time to
        check again (``None``: nothing left to interrupt)."""
        if not self._armed:
            return None
        if self._deadline is not None and now >= self._deadline:
            self.stop(Interrupt.TIMED_OUT)
            return None
        lease_end = self._last_sent + self.lease_s
        if now >= lease_end:
            logger.warning(
                "heartbeat %s: no refresh reached Redis for %.1fs; the step is stopped before recovery "
                "may run its attempt elsewhere",
                self._heartbeat_key,
                now - self._last_sent,
            )
            self.stop(Interrupt.LEASE_LOST)
            return None
        return self.first_deadline()

    def first_deadline(self) -> float:
        """When :meth:`check_time` may first have to interrupt the step (monotonic)."""
        lease_end = self._last_sent + self.lease_s
        return lease_end if self._deadline is None else min(lease_end, self._deadline)

    def stop(self, why: Interrupt) -> None:
        self._fired = True
        with self._lock:
            if self._armed:
                self.interrupted = why
                self._armed = False
                _interrupt(self._target)


class _Watcher:
    """The thread watching every step of one process that uses one Redis client."""

    def __init__(self, client: redis.Redis, key: tuple[int, int]) -> None:
        self.client = client
        self.key = key
        self.watches: dict[StepWatch, None] = {}  # insertion-ordered set
        self.keys_to_delete: list[str] = []
        self.thread = threading.Thread(target=self._run, name="chordbeat-step-watch", daemon=True)

    def _run(self) -> None:
        while True:
            time.sleep(CANCEL_POLL_S)
            with _lock:
                if not self.watches and not self.keys_to_delete:
                    del _watchers[self.key]
                    return
                watches, keys_to_delete = list(self.watches), self.keys_to_delete
                self.keys_to_delete = []
            try:
                self._poll(watches, keys_to_delete)
            except Exception:
                # Whatever went wrong, the thread must go on: without it no heartbeat of this
                # process is refreshed, and every step would be stopped when its lease ran out.
                logger.exception("step watch: a poll failed; the next one is in %ss", CANCEL_POLL_S)

    def _poll(self, watches: list[StepWatch], keys_to_delete: list[str]) -> None:
        # Taken before anything is sent: the lease counts from the send, never from the answer.
        now = time.monotonic()
        refreshing = [w for w in watches if w.refresh_due(now)]
        checking = [w for w in watches if w.wants_flag_check()]
        try:
            with self.client.pipeline(transaction=False) as pipe:
                for watch in refreshing:
                    watch.queue_refresh(pipe)
                sizes = [watch.queue_flag_check(pipe) for watch in checking]
                if keys_to_delete:
                    pipe.delete(*keys_to_delete)
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
            # The poll outlasted its period: the process was frozen (SIGSTOP, a VM pause) or Redis
            # stalled meanwhile, and the answers may be from before the freeze, when recovery had
            # not yet fenced an attempt. Check the flags again now, not a poll later.
            self._check_flags_again(checking)
            return
        for watch, size in zip(checking, sizes, strict=True):
            watch.answer(replies[:size])
            del replies[:size]

    def _check_flags_again(self, checking: list[StepWatch]) -> None:
        try:
            with self.client.pipeline(transaction=False) as pipe:
                sizes = [watch.queue_flag_check(pipe) for watch in checking]
                replies = pipe.execute()
        except redis.RedisError:
            return
        for watch, size in zip(checking, sizes, strict=True):
            watch.answer(replies[:size])
            del replies[:size]


def _moved_on(generation: int) -> bool:
    return _generation != generation


def _keep_time() -> None:
    """The time-keeping thread: sleeps until the earliest deadline of a watched step, then checks."""
    global _keeper, _keeper_wakes_at
    while True:
        with _lock:
            _keeper_wakes_at = float("-inf")  # checking: a step watched meanwhile wakes it again
            watches = [w for watcher in _watchers.values() for w in watcher.watches]
            if not watches:
                _keeper = None
                return
            generation = _generation
        now = time.monotonic()
        next_checks = [at for at in (w.check_time(now) for w in watches) if at is not None]
        wait_s = min([KEEPER_IDLE_S, *(at - now for at in next_checks)])
        with _woken:
            _keeper_wakes_at = now + wait_s
            _woken.wait_for(partial(_moved_on, generation), max(wait_s, 0.0))


_lock = threading.Lock()
#: Notified when a step is watched (its deadline may come before the keeper's next check).
_woken = threading.Condition(_lock)
_generation = 0
_watchers: dict[tuple[int, int], _Watcher] = {}
_keeper: threading.Thread | None = None
#: When the time-keeping thread checks next (monotonic): a step whose first deadline is no earlier
#: is checked then, without waking the thread (a wake-up is a thread switch on every step).
_keeper_wakes_at = float("-inf")


def _watch(watch: StepWatch) -> None:
    global _keeper, _generation
    key = (os.getpid(), id(watch.client))
    with _lock:
        watcher = _watchers.get(key)
        if watcher is None:
            watcher = _watchers[key] = _Watcher(watch.client, key)
            watcher.thread.start()
        watcher.watches[watch] = None
        if watch._armed and watch.first_deadline() < _keeper_wakes_at:
            _generation += 1
            _woken.notify_all()
        if _keeper is None:
            _keeper = threading.Thread(target=_keep_time, name="chordbeat-step-time", daemon=True)
            _keeper.start()


def _unwatch(watch: StepWatch) -> None:
    with _lock:
        # Still there: a watcher only leaves once it has nothing to watch.
        watcher = _watchers[(os.getpid(), id(watch.client))]
        watcher.watches.pop(watch, None)
        watcher.keys_to_delete.extend(watch.done_keys)


def _forget_parents_watchers() -> None:
    # A forked child has none of its parent's threads (and maybe a lock held by one of them).
    global _lock, _woken, _keeper, _keeper_wakes_at
    _lock = threading.Lock()
    _woken = threading.Condition(_lock)
    _keeper = None
    _keeper_wakes_at = float("-inf")
    _watchers.clear()


os.register_at_fork(after_in_child=_forget_parents_watchers)
