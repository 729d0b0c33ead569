"""The reference clock: one time for every process of a deployment, whatever its host's clock says.

A time one process writes and another compares (a slot, a deadline, a step's start and end, the
grace before a silent worker is taken for lost) must come from one clock: hosts' clocks disagree by
seconds, and a host whose NTP broke by minutes. Every process therefore reads the reference (the
shared Redis server's ``TIME``, installed by :mod:`celeryapp.messaging.reference_time`) at its first
use and then every :data:`MEASURE_INTERVAL_S`; in between, reference time moves on with the
process's monotonic clock, so a host clock stepped meanwhile (by NTP, by an operator) changes
nothing. The local wall clock serves only until a reference was installed and read once.

Only the first reading is waited for. Later ones are taken by a short-lived thread: a caller may be
inside a transaction (on SQLite, holding the write lock), and a frozen or unreachable Redis must not
hold it there for a socket timeout.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

logger = logging.getLogger(__name__)

#: Seconds between two readings of the reference by one process.
MEASURE_INTERVAL_S = 30.0
#: After a failed reading, the next is tried this much later (a reference away must not make every
#: caller wait for it).
RETRY_AFTER_FAILURE_S = 5.0
#: A reading whose round trip took longer is not trusted: the reference answered somewhere within
#: it, so the time it gives may be off by up to half of it.
MAX_ROUND_TRIP_S = 0.25

#: Reads the reference: seconds since the epoch, as the reference server says it now.
ReadReference = Callable[[], float]
#: Told each successful reading: (offset of this host's clock from the reference in seconds,
#: reference time of the reading). For warnings, metrics and the dashboard.
OnMeasured = Callable[[float, float], None]


@dataclass(frozen=True)
class Reading:
    """The reference time at one instant of this process's monotonic clock."""

    reference_s: float
    monotonic_s: float
    #: This host's wall clock minus the reference's, in seconds.
    offset_s: float


class ReferenceClock:
    """Reference time, from an occasional reading of the reference and the monotonic clock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._read: ReadReference | None = None
        self._on_measured: OnMeasured | None = None
        self._reading: Reading | None = None
        self._next_try_s = float("-inf")
        #: Process whose background reading is under way (a forked child has no such thread).
        self._reader_pid: int | None = None
        self._reader_lock = threading.Lock()
        #: The last reading failed: a failure is logged once, not every RETRY_AFTER_FAILURE_S.
        self._failing = False

    def use(self, read: ReadReference | None, on_measured: OnMeasured | None = None) -> None:
        """Take ``read`` as the reference from now on (``None``: this host's own clock)."""
        with self._lock:
            self._read, self._on_measured = read, on_measured
            self._reading, self._next_try_s = None, float("-inf")

    @property
    def reading(self) -> Reading | None:
        """The last successful reading (``None``: none yet, or no reference installed)."""
        return self._reading

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.timestamp(), UTC)

    def timestamp(self) -> float:
        """Reference time in seconds since the epoch."""
        if self._read is not None and time.monotonic() >= self._next_try_s:
            if self._reading is None:
                self.measure()
            else:
                self._measure_in_background()
        reading = self._reading
        if reading is None:
            return time.time()
        return reading.reference_s + (time.monotonic() - reading.monotonic_s)

    def _measure_in_background(self) -> None:
        with self._reader_lock:
            if self._reader_pid == os.getpid():
                return
            self._reader_pid = os.getpid()
        threading.Thread(target=self._background_reading, name="chordbeat-reference-clock", daemon=True).start()

    def _background_reading(self) -> None:
        try:
            self.measure()
        finally:
            self._reader_pid = None

    def measure(self) -> Reading | None:
        """Read the reference now; on failure keep the previous reading (``None`` if there is none)."""
        read, on_measured = self._read, self._on_measured
        if read is None:
            return None
        # One reader at a time; the others go on with the previous reading meanwhile.
        if not self._lock.acquire(blocking=False):
            return self._reading
        try:
            reading = self._read_once(read)
            now_s = time.monotonic()
            if reading is None:
                self._failing, self._next_try_s = True, now_s + RETRY_AFTER_FAILURE_S
                return self._reading
            if self._failing:
                logger.info("reference clock: read again")
            self._reading, self._next_try_s, self._failing = reading, now_s + MEASURE_INTERVAL_S, False
        finally:
            self._lock.release()
        if on_measured is not None:
            try:
                on_measured(reading.offset_s, reading.reference_s)
            except Exception:
                logger.warning("reference clock: reporting the offset failed", exc_info=True)
        return reading

    def _read_once(self, read: ReadReference) -> Reading | None:
        """The reading of the quickest of a few round trips. A slow one (a loaded host, a busy
        Redis) does not replace a good reading; with none yet, it is still much nearer the
        reference than this host's clock, which may be minutes off."""
        best: tuple[float, Reading] | None = None
        for _try in range(3):
            wall_before, before = time.time(), time.monotonic()
            try:
                reference_s = read()
            except Exception as exc:
                log = logger.debug if self._failing else logger.warning
                log("reference clock: cannot read the reference (%s); keeping the last reading", exc)
                break
            after, wall_after = time.monotonic(), time.time()
            # The reference answered about halfway through the round trip.
            middle = (before + after) / 2
            offset_s = (wall_before + wall_after) / 2 - reference_s
            reading = Reading(reference_s + (after - middle), after, offset_s)
            if after - before <= MAX_ROUND_TRIP_S:
                return reading
            if best is None or after - before < best[0]:
                best = (after - before, reading)
        if best is not None and self._reading is None:
            logger.info("reference clock: first reading within %.2f s (a slow round trip)", best[0] / 2)
            return best[1]
        if best is not None and not self._failing:
            logger.warning("reference clock: every reading took over %ss; keeping the last one", MAX_ROUND_TRIP_S)
        return None


#: The process's reference clock.
clock = ReferenceClock()


def _fresh_locks_in_child() -> None:
    # A fork copies a lock held by another thread (a reading under way) held for ever.
    clock._lock, clock._reader_lock, clock._reader_pid = threading.Lock(), threading.Lock(), None


os.register_at_fork(after_in_child=_fresh_locks_in_child)
