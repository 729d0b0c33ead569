"""Percentiles of samples and the median [min-max] of repeated runs."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile, ``q`` in [0, 1]."""
    if not values:
        raise ValueError("no samples")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def percentiles(values: Sequence[float], *names: str) -> dict[str, float]:
    """``percentiles(v, "p50", "p95")`` → ``{"p50": …, "p95": …}``."""
    return {name: percentile(values, int(name[1:]) / 100) for name in names}


def gaps_ms(bounds: Mapping[tuple[int, int], tuple[float, float]]) -> list[float]:
    """Advancement gaps: last end of group g → first start of g+1, per (pipeline, group) bounds."""
    return [(bounds[(p, g + 1)][0] - bounds[(p, g)][1]) * 1000 for (p, g) in bounds if (p, g + 1) in bounds]


def group_bounds(records: Iterable[tuple[int, int, float, float]]) -> dict[tuple[int, int], tuple[float, float]]:
    """First start and last end of each (pipeline, group) from ``(pipeline, group, start, end)``."""
    bounds: dict[tuple[int, int], tuple[float, float]] = {}
    for pipeline, group, start, end in records:
        lo, hi = bounds.get((pipeline, group), (float("inf"), float("-inf")))
        bounds[(pipeline, group)] = (min(lo, start), max(hi, end))
    return bounds


def throughput(records: Sequence[tuple[int, int, float, float]]) -> float:
    """Tasks per second between the first start and the last end."""
    first = min(r[2] for r in records)
    last = max(r[3] for r in records)
    return len(records) / max(last - first, 1e-9)


def _round(value: float) -> float:
    return round(value, 3 if abs(value) < 10 else 1)


def combine(runs: Sequence[Any]) -> tuple[Any, Any]:
    """Median of repeated runs, and [min, max]: a number, or an object of numbers, per run."""
    if isinstance(runs[0], dict):
        parts = {key: combine([run[key] for run in runs]) for key in runs[0]}
        return {k: v[0] for k, v in parts.items()}, {k: v[1] for k, v in parts.items()}
    if all(isinstance(run, bool) for run in runs):
        # A yes/no of each run (is True an int, and its median 1): true only when every run says so.
        return all(runs), [min(runs), max(runs)]
    return _round(statistics.median(runs)), [_round(min(runs)), _round(max(runs))]
