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

The reference itself may jump (a Redis failover to a host with another clock, an NTP step on the
Redis host). A reading further than a second from where the last one said the reference would be
is such a jump, unless this host's wall clock moved with the reference (then it is this process's
monotonic clock that stood still: a suspended host). The process that sees it first records a
correction (:mod:`celeryapp.clock_correction`) beside the reference, read with every
reading, so that every process (those started since too) subtracts the same one from the raw
reference: time goes on without a step and slowly meets the reference again.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Protocol

from celeryapp.clock_correction import NO_CORRECTION, BadCorrection, Correction, is_jump

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


class SharedReference(Protocol):
    """A reference that keeps the deployment's correction beside it (Redis: ``TIME`` and one key)."""

    def read(self) -> tuple[float, str | None]:
        """The raw reference now (seconds since the epoch) and the stored correction (``None``: none),
        in one round trip."""

    def share(self, expected: str | None, correction: str) -> str | None:
        """Store ``correction`` unless the stored one is no longer ``expected`` (compare-and-set);
        return the one stored afterwards."""


class _Unshared:
    """A plain reading function: its correction is this process's alone."""

    def __init__(self, read: ReadReference) -> None:
        self._read: ReadReference = read
        self._stored: str | None = None

    def read(self) -> tuple[float, str | None]:
        return self._read(), self._stored

    def share(self, expected: str | None, correction: str) -> str | None:
        if self._stored == expected:
            self._stored = correction
        return self._stored


@dataclass(frozen=True)
class Reading:
    """The reference time at one instant of this process's monotonic clock."""

    #: The raw reference (before any correction).
    reference_s: float
    monotonic_s: float
    #: This host's wall clock minus the (corrected) reference's, in seconds.
    offset_s: float
    #: This host's wall clock at the reading.
    wall_s: float = 0.0
    #: How far off the reading may be: half its round trip.
    error_s: float = 0.0
    #: The deployment's correction in force from this reading on (one attribute with the reading,
    #: so that a caller never applies a new correction to an old reading).
    correction: Correction = NO_CORRECTION


class ReferenceClock:
    """Reference time, from an occasional reading of the reference and the monotonic clock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reference: SharedReference | None = None
        self._on_measured: OnMeasured | None = None
        self._reading: Reading | None = None
        #: The stored text of the correction in force (the reading's), to compare the next with.
        self._correction_text: str | None = None
        self._next_try_s = float("-inf")
        #: Process whose background reading is under way (a forked child has no such thread).
        self._reader_pid: int | None = None
        self._reader_lock = threading.Lock()
        #: The last reading failed: a failure is logged once, not every RETRY_AFTER_FAILURE_S.
        self._failing = False
        #: The thread taking the first reading (it must not wait for itself).
        self._first_reader: int | None = None

    def use(self, read: ReadReference | SharedReference | None, on_measured: OnMeasured | None = None) -> None:
        """Take ``read`` as the reference from now on (``None``: this host's own clock)."""
        reference = _Unshared(read) if callable(read) else read
        with self._lock:
            self._reference, self._on_measured = reference, on_measured
            self._reading, self._next_try_s, self._correction_text = None, float("-inf"), None

    @property
    def reading(self) -> Reading | None:
        """The last successful reading (``None``: none yet, or no reference installed)."""
        return self._reading

    @property
    def correction(self) -> Correction:
        """What this process subtracts from the raw reference (:data:`NO_CORRECTION` mostly)."""
        reading = self._reading
        return NO_CORRECTION if reading is None else reading.correction

    def jumped_forward_within(self, seconds: float) -> bool:
        """Whether the reference last jumped forward, less than ``seconds`` ago. Redis expires keys
        by its own clock: those that had less time to live than the jump vanished at once."""
        reading = self._reading
        if reading is None or reading.correction.last_jump_s <= 0:
            return False
        raw_now_s = reading.reference_s + (time.monotonic() - reading.monotonic_s)
        return raw_now_s - reading.correction.at_reference_s < seconds

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.timestamp(), UTC)

    def timestamp(self) -> float:
        """Reference time in seconds since the epoch."""
        if self._reference is not None and time.monotonic() >= self._next_try_s:
            if self._reading is None:
                self.measure()
            else:
                self._measure_in_background()
        reading = self._reading
        if reading is None:
            return time.time()
        return reading.correction.corrected(reading.reference_s + (time.monotonic() - reading.monotonic_s))

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
        reference, on_measured = self._reference, self._on_measured
        if reference is None:
            return None
        # One reader at a time; the others go on with the previous reading meanwhile. With none
        # yet, they wait for the one under way: the host's clock (maybe minutes off) must not stand
        # in for the reference because another thread happened to read first (a worker 35 s ahead
        # discarded its first message as expired while its start-up recovery was reading).
        if not self._lock.acquire(blocking=False):
            if self._reading is not None or self._first_reader == threading.get_ident():
                return self._reading
            self._lock.acquire()
            if self._reading is not None or time.monotonic() < self._next_try_s:
                # Taken, or just failed, by the thread this one waited for.
                self._lock.release()
                return self._reading
        self._first_reader = threading.get_ident() if self._reading is None else None
        try:
            read = self._read_once(reference)
            now_s = time.monotonic()
            if read is None:
                self._failing, self._next_try_s = True, now_s + RETRY_AFTER_FAILURE_S
                return self._reading
            if self._failing:
                logger.info("reference clock: read again")
            reading, stored = read
            correction = self._follow(reference, reading, stored)
            offset_s = reading.wall_s - correction.corrected(reading.reference_s)
            self._reading = reading = replace(reading, offset_s=offset_s, correction=correction)
            self._next_try_s, self._failing = now_s + MEASURE_INTERVAL_S, False
        finally:
            self._first_reader = None
            self._lock.release()
        if on_measured is not None:
            try:
                on_measured(reading.offset_s, correction.corrected(reading.reference_s))
            except Exception:
                logger.warning("reference clock: reporting the offset failed", exc_info=True)
        return reading

    def _follow(self, reference: SharedReference, reading: Reading, stored: str | None) -> Correction:
        """The correction after ``reading``: the shared one, a new one if the reference jumped, or
        ours written back if the reference lost it (a Redis restart without its data: every process
        that knew it writes back the same record, and the jump it covers does not reappear)."""
        current = NO_CORRECTION if self._reading is None else self._reading.correction
        if stored is not None and stored != self._correction_text:
            try:
                Correction.from_text(stored)
            except BadCorrection as exc:
                logger.error("reference clock: the shared clock correction is garbled (%s); replacing it", exc)
                try:
                    stored = reference.share(stored, self._correction_text or current.to_text())
                except Exception:
                    return current
        if stored is None and self._correction_text is not None:
            try:
                stored = reference.share(None, self._correction_text)
            except Exception as exc:
                logger.warning("reference clock: cannot write the clock correction back (%s)", exc)
                return current
            if stored == self._correction_text:
                logger.warning("reference clock: the shared clock correction was gone; written back")
        if stored != self._correction_text:
            # Another process saw a jump first (or this one just started): take its correction,
            # so that every process keeps the same time.
            return self._adopt(stored, current)
        previous = self._reading
        if previous is None:
            return current
        elapsed_s = reading.monotonic_s - previous.monotonic_s
        expected_raw_s = previous.reference_s + elapsed_s
        step_s = reading.reference_s - expected_raw_s
        if not is_jump(step_s, previous.error_s + reading.error_s):
            return current
        wall_step_s = reading.wall_s - (previous.wall_s + elapsed_s)
        if not is_jump(step_s - wall_step_s, previous.error_s + reading.error_s):
            # This host's clock moved as the reference did: our monotonic clock stood still (a
            # suspended host or VM), the reference did not jump.
            logger.info("reference clock: this process's monotonic clock missed %.1f s; read again", step_s)
            return current
        jumped = current.after_jump(expected_raw_s, reading.reference_s)
        text = jumped.to_text()
        try:
            stored = reference.share(self._correction_text, text)
        except Exception as exc:
            # Kept here: this process goes on without the step; the others see the jump themselves
            # and the first to store its correction gives it to this one at its next reading.
            logger.error("reference clock: Redis's clock jumped %.1f s; cannot share the correction (%s)", step_s, exc)
            return jumped
        logger.error(
            "reference clock: Redis's clock jumped %.1f s %s; chordbeat's time goes on without the step "
            "and takes it back at %.1f %% (%s)",
            abs(step_s),
            "forward" if step_s > 0 else "back",
            jumped.slew * 100,
            "correction recorded" if stored == text else "another process recorded it first",
        )
        return self._adopt(stored, current)

    def _adopt(self, stored: str | None, current: Correction) -> Correction:
        if stored is None:
            self._correction_text = None
            return NO_CORRECTION
        try:
            correction = Correction.from_text(stored)
        except BadCorrection:
            return current  # garbled again since it was replaced: the next reading replaces it
        self._correction_text = stored
        return correction

    def _read_once(self, reference: SharedReference) -> tuple[Reading, str | None] | None:
        """The reading of the quickest of a few round trips. A slow one (a loaded host, a busy
        Redis) does not replace a good reading; with none yet, it is still much nearer the
        reference than this host's clock, which may be minutes off."""
        best: tuple[float, Reading, str | None] | None = None
        for _try in range(3):
            wall_before, before = time.time(), time.monotonic()
            try:
                reference_s, stored = reference.read()
            except Exception as exc:
                log = logger.debug if self._failing else logger.warning
                log("reference clock: cannot read the reference (%s); keeping the last reading", exc)
                break
            after, wall_after = time.monotonic(), time.time()
            # The reference answered about halfway through the round trip.
            middle = (before + after) / 2
            wall_s = (wall_before + wall_after) / 2
            reading = Reading(
                reference_s + (after - middle), after, wall_s - reference_s, wall_s + (after - middle), after - middle
            )
            if after - before <= MAX_ROUND_TRIP_S:
                return reading, stored
            if best is None or after - before < best[0]:
                best = (after - before, reading, stored)
        if best is not None and self._reading is None:
            logger.info("reference clock: first reading within %.2f s (a slow round trip)", best[0] / 2)
            return best[1], best[2]
        if best is not None and not self._failing:
            logger.warning("reference clock: every reading took over %ss; keeping the last one", MAX_ROUND_TRIP_S)
        return None


#: The process's reference clock.
clock = ReferenceClock()


def _fresh_locks_in_child() -> None:
    # A fork copies a lock held by another thread (a reading under way) held for ever.
    clock._lock, clock._reader_lock, clock._reader_pid = threading.Lock(), threading.Lock(), None
    clock._first_reader = None


os.register_at_fork(after_in_child=_fresh_locks_in_child)
