"""Rules of alert delivery: when to try again, when to give up, how many a channel may get.

Pure: the sender (:mod:`celeryapp.alerting.sender`) asks, with times read from the reference clock
and counts read from the outbox, and does what these say.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

#: Pause after a delivery's first failed attempt; each further failure doubles it...
FIRST_BACKOFF_S = 5.0
#: ...up to this: a receiver back from an outage gets its alerts within ten minutes.
MAX_BACKOFF_S = 600.0
#: The window of the per-channel rate limit (``CHORDBEAT_ALERT_RATE_LIMIT`` per this many seconds).
RATE_WINDOW_S = 60.0


def backoff_s(attempts: int) -> float:
    """Seconds to wait after the ``attempts``-th failed attempt (1 for the first)."""
    if attempts <= 1:
        return FIRST_BACKOFF_S
    # Capped before exponentiation: 2**attempts of a long outage's hundredth attempt is no float.
    return min(FIRST_BACKOFF_S * 2.0 ** min(attempts - 1, 32), MAX_BACKOFF_S)


def gives_up(alert_at: datetime, now: datetime, retry_for_s: float) -> bool:
    """Whether a delivery that failed at ``now`` is given up: it has been tried for ``retry_for_s``
    since the alert was decided (a delivery is retried for a time, whatever the number of attempts)."""
    # Compared as instants: seconds compared as floats can disagree with the end instant by a
    # microsecond's rounding, and a last try then fell on an instant already given up.
    return now >= alert_at + timedelta(seconds=retry_for_s)


def next_try_at(alert_at: datetime, now: datetime, attempts: int, retry_for_s: float) -> datetime | None:
    """When a delivery that failed at ``now`` after ``attempts`` attempts is tried again; ``None``:
    given up. The last try falls on the end of the retry time, not a backoff beyond it."""
    if gives_up(alert_at, now, retry_for_s):
        return None
    last = alert_at + timedelta(seconds=retry_for_s)
    return min(now + timedelta(seconds=backoff_s(attempts)), last)


@dataclass(frozen=True)
class ChannelPlan:
    """What a channel's due deliveries get in one pass of the sender (oldest first): the first
    ``send`` each a message, the next ``summarise`` one summary message between them, the rest
    (``hold``) wait until the window has room again."""

    send: int
    summarise: int
    hold: int


def plan_channel(due: int, sent_in_window: int, summary_in_window: bool, limit: int) -> ChannelPlan:
    """Split ``due`` deliveries of a channel that got ``sent_in_window`` messages (and a summary,
    if ``summary_in_window``) in the last :data:`RATE_WINDOW_S`, so that no window carries more
    than ``limit`` messages and one summary: a storm reaches a pager as ``limit`` alerts and one
    message saying how many more there were."""
    due = max(due, 0)
    send = min(due, max(limit - sent_in_window, 0))
    rest = due - send
    if rest == 0:
        return ChannelPlan(send, 0, 0)
    if summary_in_window:
        return ChannelPlan(send, 0, rest)
    return ChannelPlan(send, rest, 0)
