"""A step's lease: how long it may run on without a heartbeat refresh that Redis acknowledged.

Recovery takes an attempt for lost once its heartbeat key expired, a TTL after the last refresh by
Redis's clock; the lease ends earlier by a margin, so that a step cut off from Redis has stopped
before its attempt can be run elsewhere. The watch (:mod:`celeryapp.worker.heartbeat`) enforces it.
"""

from __future__ import annotations

#: Seconds an interrupt may take to land in a step at work: it lands at the step's next bytecode,
#: after whatever C call (a short sleep, a socket read) the step is in returns.
INTERRUPT_LANDING_S = 0.5
#: Seconds the time-keeping thread may wake late (a loaded host, the GIL held by the step).
KEEPER_LATENESS_S = 0.25
#: What the lease keeps back from the heartbeat's TTL (a quarter of a TTL below 3 s, which would
#: otherwise leave no lease at all).
LEASE_MARGIN_S = INTERRUPT_LANDING_S + KEEPER_LATENESS_S


def lease_s(ttl_s: float) -> float:
    """How long a step may run on without a heartbeat refresh Redis acknowledged.

    Counted from when the last acknowledged refresh was *sent*: Redis started the key's TTL no
    earlier, so recovery, which sees the key gone only after a TTL on Redis's clock, cannot re-queue
    the attempt before the lease and its margin have passed and the interrupt has landed.
    """
    return ttl_s - min(LEASE_MARGIN_S, ttl_s / 4)
