"""How long a schedule's runs take, and whether they are getting slower: p50 and p95 of its latest
completed runs, and the rule that compares them with the runs before.

The rule (docs/dashboard.md, "Runs"): a schedule is getting slower when it has at least
``2 * window`` completed runs, and the p50 of its latest ``window`` runs is at least
``SLOWER_RATIO`` times the p50 of the ``window`` runs before them and longer by at least
``SLOWER_MIN_S``. Medians, not means: one stuck run does not make a schedule "slower", and the
absolute floor keeps a 0.2 s step that took 0.3 s once out of the list.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

#: Completed runs in one window: the trend's p50/p95 are over the latest this many.
TREND_RUNS = 20
#: The latest window's p50 over the previous one's for "getting slower".
SLOWER_RATIO = 1.25
#: ... and at least this many seconds longer.
SLOWER_MIN_S = 1.0


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile (``fraction`` in (0, 1]): always one of ``values``, so a p95 is a
    duration some run really took. ``values`` must not be empty."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    ordered = sorted(values)
    return ordered[max(1, math.ceil(fraction * len(ordered))) - 1]


@dataclass(frozen=True)
class DurationTrend:
    """A schedule's durations (seconds) over its latest window, and the p50 of the window before."""

    runs: int
    p50: float | None
    p95: float | None
    #: The p50 of the ``window`` runs before the latest ones; None with fewer than twice window runs.
    previous_p50: float | None
    slower: bool

    @property
    def ratio(self) -> float | None:
        """Latest p50 over the previous one (None without both, or when the previous is 0)."""
        if self.p50 is None or not self.previous_p50:
            return None
        return self.p50 / self.previous_p50


def duration_trend(newest_first: Sequence[float], window: int = TREND_RUNS) -> DurationTrend:
    """The trend of completed runs' durations, newest first (more than ``2 * window`` are ignored)."""
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    values = [v for v in newest_first[: 2 * window] if math.isfinite(v)]
    latest, before = values[:window], values[window : 2 * window]
    if not latest:
        return DurationTrend(0, None, None, None, False)
    p50, p95 = percentile(latest, 0.5), percentile(latest, 0.95)
    previous = percentile(before, 0.5) if len(before) == window else None
    slower = previous is not None and p50 >= previous * SLOWER_RATIO and p50 - previous >= SLOWER_MIN_S
    return DurationTrend(len(latest), p50, p95, previous, slower)
