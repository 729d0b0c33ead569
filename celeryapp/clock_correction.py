"""The correction that keeps the reference clock continuous when the reference itself jumps.

The reference (Redis's ``TIME``, :mod:`celeryapp.clock`) jumps when Redis fails over to a host whose
clock differs, or when NTP steps the Redis host's clock. Every process would see its time step at
once: forward, every fast schedule's slots missed and deadlines passed early; backward, beat silent
and recovery waiting for the size of the jump. So the first process that sees a jump records a
correction, shared by every process, that it subtracts from the raw reference:

    corrected(raw) = raw - remaining(raw)
    remaining(raw) = sign(jump) * max(0, |jump| - slew * (raw - at_reference))

At the jump the corrected time goes on from where it was; afterwards the correction is taken back
at ``slew`` seconds per second, so the corrected time runs a little fast (after a forward jump) or
slow (after a backward one) until it meets the raw reference again. It never steps and never goes
back (``slew`` < 1), whichever way the reference jumped. A second jump while one is being taken back
adds to what remains of it.

Pure: every instant is passed in. The record is JSON, read from Redis and so hostile until checked.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from celeryapp.errors import ChordbeatError

#: Where the deployment's correction lives in Redis (JSON, :class:`Correction`), beside ``TIME``.
#: It never expires: once taken back it subtracts nothing, and it keeps the count of jumps. (The
#: prefix of :mod:`celeryapp.domain.names` spelled out: the client imports nothing else.)
CORRECTION_KEY = "chordbeat:clock:correction"

#: A reading further than this from where the last one said the reference would be (seconds,
#: beyond the two readings' own uncertainty) is a jump of the reference.
JUMP_THRESHOLD_S = 1.0
#: Seconds of correction taken back per second (0.2 %: 2 ms a second). Slow enough that nothing
#: timed by the reference notices: a lease of a 15 s heartbeat TTL runs 0.03 s longer or shorter
#: (its margin is 0.75 s), a run's one-hour deadline 7.2 s; docs/reliability.md says more.
SLEW_RATE = 0.002
#: A correction larger than this (seconds, ten years) is not a clock's jump but a garbled record.
MAX_JUMP_S = 10 * 365 * 86400.0


class BadCorrection(ChordbeatError, ValueError):
    """A stored correction that is not one (names the field)."""


@dataclass(frozen=True)
class Correction:
    """What to subtract from the raw reference, and how fast it shrinks."""

    #: Seconds subtracted at ``at_reference_s`` (positive: the reference jumped forward).
    jump_s: float = 0.0
    #: Raw reference time at which the correction was ``jump_s`` (just after the jump).
    at_reference_s: float = 0.0
    #: Seconds of correction taken back per second of reference time.
    slew: float = SLEW_RATE
    #: Jumps recorded so far (this one included): a counter for the metrics.
    jumps: int = 0
    #: The last jump's own size in seconds (``jump_s`` also holds what was left of earlier ones).
    last_jump_s: float = 0.0

    def remaining_s(self, raw_s: float) -> float:
        """What is still subtracted at raw reference time ``raw_s``."""
        elapsed = max(0.0, raw_s - self.at_reference_s)
        return math.copysign(max(0.0, abs(self.jump_s) - self.slew * elapsed), self.jump_s)

    def corrected(self, raw_s: float) -> float:
        """The deployment's time at raw reference time ``raw_s``."""
        return raw_s - self.remaining_s(raw_s)

    def done_at(self) -> float:
        """Raw reference time from which the correction is taken back entirely."""
        return self.at_reference_s + abs(self.jump_s) / self.slew

    def after_jump(self, expected_raw_s: float, raw_s: float) -> Correction:
        """The correction once the reference read ``raw_s`` where ``expected_raw_s`` was expected:
        the corrected time at ``raw_s`` is what it would have been at ``expected_raw_s``."""
        step_s = raw_s - expected_raw_s
        return Correction(
            jump_s=self.remaining_s(expected_raw_s) + step_s,
            at_reference_s=raw_s,
            slew=SLEW_RATE,
            jumps=self.jumps + 1,
            last_jump_s=step_s,
        )

    def to_text(self) -> str:
        return json.dumps(
            {
                "jump_s": round(self.jump_s, 6),
                "at_reference": round(self.at_reference_s, 6),
                "slew": self.slew,
                "jumps": self.jumps,
                "last_jump_s": round(self.last_jump_s, 6),
            },
            sort_keys=True,
        )

    @classmethod
    def from_text(cls, text: str | bytes) -> Correction:
        """The correction a stored record holds; :class:`BadCorrection` naming the field if it is none."""
        try:
            record = json.loads(text)
        except (ValueError, UnicodeDecodeError):
            raise BadCorrection("the correction is not JSON") from None
        if not isinstance(record, dict):
            raise BadCorrection("the correction is not a JSON object")
        jump_s = _number(record, "jump_s", -MAX_JUMP_S, MAX_JUMP_S)
        at_reference_s = _number(record, "at_reference", 0.0, 1e11)
        slew = _number(record, "slew", 1e-6, 0.5)
        last_jump_s = _number(record, "last_jump_s", -MAX_JUMP_S, MAX_JUMP_S)
        jumps = record.get("jumps")
        if not isinstance(jumps, int) or isinstance(jumps, bool) or not 0 <= jumps < 2**53:
            raise BadCorrection("jumps: not a count")
        return cls(jump_s, at_reference_s, slew, jumps, last_jump_s)


def _number(record: dict[str, object], field: str, low: float, high: float) -> float:
    value = record.get(field)
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise BadCorrection(f"{field}: not a number")
    if not low <= value <= high:
        raise BadCorrection(f"{field}: {value} is outside [{low}, {high}]")
    return float(value)


#: No correction: the raw reference as it is.
NO_CORRECTION = Correction()


def is_jump(step_s: float, uncertainty_s: float) -> bool:
    """Whether a reading ``step_s`` away from where it was expected is a jump of the reference, when
    the two readings may each be off by their half round trips (``uncertainty_s`` together)."""
    return abs(step_s) > JUMP_THRESHOLD_S + uncertainty_s
