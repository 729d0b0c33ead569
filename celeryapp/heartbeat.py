"""The watch kept beside a running step: heartbeat key refresh and cancel-flag polling."""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from types import TracebackType

import redis

from celeryapp.errors import StepCancelled

logger = logging.getLogger(__name__)

#: Seconds between two looks at the cancel flag; also bounds how fast a cancel stops a step.
CANCEL_POLL_S = 0.5


def _interrupt(thread_id: int) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(StepCancelled))


class StepWatch:
    """Keeps ``heartbeat_key`` alive while a step runs and interrupts the step when cancelled.

    The interrupt is :class:`StepCancelled` raised inside the step's thread; it lands at the next
    Python bytecode, so a step blocked in a long C call stops when that call returns.
    """

    def __init__(
        self,
        client: redis.Redis,
        *,
        heartbeat_key: str,
        cancel_key: str,
        ttl_s: float,
        timeout_s: float | None = None,
        done_keys: tuple[str, ...] = (),
    ) -> None:
        self._client = client
        self._heartbeat_key = heartbeat_key
        self._cancel_key = cancel_key
        self._deadline = time.monotonic() + timeout_s if timeout_s else None
        self._done_keys = done_keys
        self._ttl_ms = int(ttl_s * 1000)
        self._refresh_s = ttl_s / 3
        self._target = threading.get_ident()
        self._armed = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chordbeat-step-watch", daemon=True)
        self.cancelled = False
        self.timed_out = False

    def __enter__(self) -> StepWatch:
        self._beat()
        self._armed = True
        self._thread.start()
        return self

    def disarm(self) -> None:
        """Called when the step's code has returned: no interrupt may land after this."""
        with self._lock:
            self._armed = False

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.disarm()
        self._stop.set()
        self._thread.join()
        try:
            self._client.delete(self._heartbeat_key, *self._done_keys)
        except redis.RedisError:
            logger.warning("could not delete heartbeat key %s; it expires by itself", self._heartbeat_key)

    def _beat(self) -> None:
        try:
            self._client.set(self._heartbeat_key, "1", px=self._ttl_ms)
        except redis.RedisError as exc:
            logger.warning("heartbeat %s not refreshed: %s", self._heartbeat_key, exc)

    def _run(self) -> None:
        last_beat = time.monotonic()
        while not self._stop.wait(CANCEL_POLL_S):
            if self._deadline is not None and time.monotonic() >= self._deadline:
                # Also in thread pools and inside code that swallows the soft time limit.
                self._fire("timed_out")
                return
            if time.monotonic() - last_beat >= self._refresh_s:
                self._beat()
                last_beat = time.monotonic()
            try:
                cancelled = bool(self._client.exists(self._cancel_key))
            except redis.RedisError:
                continue
            if cancelled:
                self._fire("cancelled")
                return

    def _fire(self, why: str) -> None:
        with self._lock:
            if self._armed:
                setattr(self, why, True)
                self._armed = False
                _interrupt(self._target)
