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


def _text(value: object) -> str | None:
    return value.decode(errors="replace") if isinstance(value, bytes) else None if value is None else str(value)


def _interrupt(thread_id: int) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(StepCancelled))


class StepWatch:
    """Keeps ``heartbeat_key`` alive while a step runs and interrupts the step when it must stop:
    its execution was cancelled, its timeout passed, or recovery gave its attempt up (``fenced_key``).

    The interrupt is :class:`StepCancelled` raised inside the step's thread; it lands at the next
    Python bytecode, so a step blocked in a long C call stops when that call returns. The heartbeat
    goes on until the step has really returned: a step that unwinds slowly after the interrupt is
    still running, and must not look like a lost worker whose attempt recovery runs again.
    """

    def __init__(
        self,
        client: redis.Redis,
        *,
        heartbeat_key: str,
        cancel_key: str,
        fenced_key: str | None = None,
        stop_key: str | None = None,
        ttl_s: float,
        timeout_s: float | None = None,
        done_keys: tuple[str, ...] = (),
    ) -> None:
        self._client = client
        self._heartbeat_key = heartbeat_key
        self._cancel_key = cancel_key
        self._stop_keys = (cancel_key,) if fenced_key is None else (cancel_key, fenced_key)
        self._stop_key = stop_key
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
        self.fenced = False
        #: Why an operator stopped the attempt (Flower's Terminate or Revoke), if one did.
        self.stopped: str | None = None

    def __enter__(self) -> StepWatch:
        if self._stop_key is None:
            self._beat()
        else:
            # The first heartbeat and the look at the operator's stop flag share a round trip.
            try:
                with self._client.pipeline(transaction=False) as pipe:
                    pipe.set(self._heartbeat_key, "1", px=self._ttl_ms)
                    pipe.get(self._stop_key)
                    _, stopped = pipe.execute()
            except redis.RedisError as exc:
                logger.warning("heartbeat %s not refreshed: %s", self._heartbeat_key, exc)
            else:
                self.stopped = _text(stopped)
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
        # The watch thread deletes the keys on its way out, after its last refresh: the step's
        # outcome is recorded meanwhile instead of waiting for a thread join and a round trip.
        self.disarm()
        self._stop.set()

    def _delete_keys(self) -> None:
        try:
            self._client.delete(self._heartbeat_key, *self._done_keys)
        except redis.RedisError:
            logger.warning("could not delete heartbeat key %s; it expires by itself", self._heartbeat_key)

    def _beat(self) -> bool:
        try:
            self._client.set(self._heartbeat_key, "1", px=self._ttl_ms)
        except redis.RedisError as exc:
            logger.warning("heartbeat %s not refreshed: %s", self._heartbeat_key, exc)
            return False
        return True

    def _must_stop(self) -> str | None:
        """Why the step must stop now (``cancelled``, ``fenced`` or ``stopped``), if it must."""
        try:
            with self._client.pipeline(transaction=False) as pipe:
                for key in self._stop_keys:
                    pipe.exists(key)
                if self._stop_key is not None:
                    pipe.get(self._stop_key)
                cancelled, *rest = pipe.execute()
        except redis.RedisError:
            return None
        stopped = rest.pop() if self._stop_key is not None else None
        if rest and rest[0]:
            return "fenced"
        if cancelled:
            return "cancelled"
        if stopped is not None:
            self.stopped = _text(stopped)
            return "stopped_by_operator"
        return None

    def _run(self) -> None:
        last_beat = time.monotonic()
        fired = False
        while not self._stop.wait(CANCEL_POLL_S):
            # A failed refresh (Redis away) is tried again at the next poll, not a period later, so
            # the key is back as soon as Redis is.
            if time.monotonic() - last_beat >= self._refresh_s and self._beat():
                last_beat = time.monotonic()
            if fired:
                continue  # interrupted: only keep the heartbeat until the step has returned
            if self._deadline is not None and time.monotonic() >= self._deadline:
                # Also in thread pools and inside code that swallows the soft time limit.
                fired = self._fire("timed_out")
                continue
            looked = time.monotonic()
            why = self._must_stop()
            if why is None and time.monotonic() - looked > CANCEL_POLL_S:
                # The look outlasted a poll: the process was frozen (SIGSTOP, a VM pause) or Redis
                # stalled meanwhile, and the answer may be from before the freeze, when recovery
                # had not yet fenced the attempt. Look again now, not a poll later.
                why = self._must_stop()
            if why is not None:
                fired = self._fire(why)
        self._delete_keys()

    def _fire(self, why: str) -> bool:
        with self._lock:
            if self._armed:
                if why != "stopped_by_operator":
                    setattr(self, why, True)
                self._armed = False
                _interrupt(self._target)
        return True
