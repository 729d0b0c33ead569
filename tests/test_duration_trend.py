"""The duration trend's rule (celeryapp/domain/durations.py) as properties: p50 and p95 are
durations some run took, in order; only the latest windows count; a schedule whose latest runs
are no longer than the ones before is never "getting slower", and one whose every run got longer
by the rule's ratio and floor always is."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celeryapp.domain.durations import SLOWER_MIN_S, SLOWER_RATIO, TREND_RUNS, duration_trend, percentile

durations = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)
windows = st.integers(min_value=1, max_value=30)


@given(st.lists(durations, min_size=1, max_size=80), st.floats(min_value=0.01, max_value=1))
def test_a_percentile_is_a_duration_some_run_took_and_ignores_the_order(values: list[float], fraction: float) -> None:
    found = percentile(values, fraction)
    assert found in values
    assert percentile(sorted(values, reverse=True), fraction) == found
    # At least ``fraction`` of the values are at or below it, and fewer below it.
    assert sum(v <= found for v in values) >= math.ceil(fraction * len(values))
    assert sum(v < found for v in values) < max(1, math.ceil(fraction * len(values)))


@given(st.lists(durations, max_size=100), windows)
def test_p50_and_p95_are_over_the_latest_window_in_order(values: list[float], window: int) -> None:
    trend = duration_trend(values, window)
    latest = values[:window]
    assert trend.runs == len(latest)
    if not latest:
        assert trend.p50 is None and trend.p95 is None and not trend.slower
        return
    assert trend.p50 is not None and trend.p95 is not None
    assert min(latest) <= trend.p50 <= trend.p95 <= max(latest)
    # Runs older than the two windows change nothing.
    if len(values) >= 2 * window:
        assert duration_trend(values[: 2 * window] + [1e9] * 5, window) == trend
    assert (trend.previous_p50 is None) == (len(values) < 2 * window)


@given(st.lists(durations, min_size=2, max_size=60), windows, st.floats(min_value=0, max_value=1))
def test_runs_no_longer_than_the_ones_before_are_never_getting_slower(
    before: list[float], window: int, shrink: float
) -> None:
    previous = (before * window)[:window]
    latest = [v * shrink for v in previous]
    assert not duration_trend(latest + previous, window).slower


@given(st.lists(durations, min_size=1, max_size=60), windows, st.floats(min_value=0, max_value=10))
def test_every_run_longer_by_the_ratio_and_the_floor_is_getting_slower(
    before: list[float], window: int, extra: float
) -> None:
    previous = (before * window)[:window]
    latest = [v * SLOWER_RATIO + SLOWER_MIN_S + extra for v in previous]
    trend = duration_trend(latest + previous, window)
    assert trend.slower
    assert trend.ratio is None or trend.ratio >= SLOWER_RATIO - 1e-9  # a division rounds


def test_the_default_window_and_a_worked_example() -> None:
    # 20 runs of 100 s after 20 of 60 s: p50 100 s against 60 s, 1.67 times and 40 s longer.
    trend = duration_trend([100.0] * TREND_RUNS + [60.0] * TREND_RUNS)
    assert (trend.p50, trend.p95, trend.previous_p50, trend.slower) == (100.0, 100.0, 60.0, True)
    # A single stuck run among the latest moves the p95, not the p50: not "getting slower".
    stuck = duration_trend([3600.0] + [60.0] * (2 * TREND_RUNS - 1))
    assert (stuck.p50, stuck.p95, stuck.slower) == (60.0, 60.0, False)
    # 0.2 s to 0.3 s is 1.5 times, but not a second longer.
    assert not duration_trend([0.3] * TREND_RUNS + [0.2] * TREND_RUNS).slower


@pytest.mark.parametrize("window", [0, -1])
def test_a_window_of_no_runs_is_refused(window: int) -> None:
    with pytest.raises(ValueError, match="window"):
        duration_trend([1.0], window)
