"""Catch-up policies: what becomes of a schedule's slots no fire processed in time.

``latest`` (the default, and what a schedule without ``catchup`` does): after downtime the slot
fired runs and the missed ones before it are recorded missed. ``none``: a slot fired later than
the missed grace after its nominal time does not run either. ``all``: the newest missed slots
within ``window`` (at most ``max_runs``) run too, oldest first, one at a time. Pure: the fire
(celeryapp/worker/firing.py) passes every instant in, read from the reference clock (celeryapp/clock.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from celeryapp.domain.cadence import Cadence
from celeryapp.domain.times import span


class CatchupPolicy(StrEnum):
    """The definition's ``catchup.policy``."""

    LATEST = "latest"
    NONE = "none"
    ALL = "all"


#: ``all``'s window and run cap when the definition leaves them out: a day back, ten runs.
DEFAULT_WINDOW_S = 86400.0
DEFAULT_MAX_RUNS = 10
#: Calendar-excluded slots an ``all`` catch-up passes over looking for slots to make up, besides
#: ``max_runs``: a calendar excluding nearly every day must not make one fire walk a year of slots.
MAX_EXCLUDED_PASSED = 1000
#: Slots one instant apart.
_INSTANT = timedelta(microseconds=1)
#: ``all``'s walk back over the missed slots goes a stretch at a time: the first is an hour long,
#: one without slots is followed by one four times as long, one holding more than
#: ``_STRETCH_SLOTS`` is walked again a quarter as long (down to a minute, which no cadence fills:
#: cron fires at most once a minute, intervals are at least a second).
_FIRST_STRETCH = timedelta(hours=1)
_STRETCH_SLOTS = 1000
_SHORTEST_STRETCH = timedelta(minutes=1)

#: The start of every missed slot's record detail; what became of it follows.
NOT_FIRED = "not fired: beat, Redis or the workers were down, or its fire message was lost"


@dataclass(frozen=True)
class CatchupRules:
    """The definition's ``catchup``; ``window_s`` and ``max_runs`` are set for ``all`` only."""

    policy: CatchupPolicy = CatchupPolicy.LATEST
    window_s: float | None = None
    max_runs: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"policy": self.policy.value}
        if self.policy is CatchupPolicy.ALL:
            assert self.window_s is not None
            out["window"] = int(self.window_s) if self.window_s.is_integer() else self.window_s
            out["max_runs"] = self.max_runs
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any] | None) -> CatchupRules | None:
        """Rebuild from :meth:`to_json` output (as stored); ``None`` stays ``None``."""
        if raw is None:
            return None
        policy = CatchupPolicy(raw["policy"])
        if policy is not CatchupPolicy.ALL:
            return cls(policy)
        return cls(policy, float(raw["window"]), int(raw["max_runs"]))


def policy_of(rules: CatchupRules | None) -> CatchupPolicy:
    return CatchupPolicy.LATEST if rules is None else rules.policy


def too_late(rules: CatchupRules | None, *, nominal_at: datetime, now: datetime, grace_s: float) -> str | None:
    """Why a ``none`` schedule's slot fired at ``now`` does not run (it is more than the missed
    grace late), or ``None``."""
    late_s = (now - nominal_at).total_seconds()
    if policy_of(rules) is not CatchupPolicy.NONE or late_s <= grace_s:
        return None
    return f"not run: fired {span(late_s)} late; catchup: none"


def make_up_slots(
    cadence: Cadence,
    rules: CatchupRules | None,
    *,
    between: tuple[datetime, datetime],
    now: datetime,
    excluded: Callable[[datetime], str | None],
) -> tuple[datetime, ...]:
    """The missed slots an ``all`` catch-up runs, oldest first: the newest ``max_runs`` of the
    slots strictly between ``between``'s two (the last processed slot and the one fired) that
    are at most ``window`` old at ``now`` and that the calendar does not exclude.

    Walked back from the newest a stretch at a time (each stretch's slots found forward, at most
    :data:`_STRETCH_SLOTS` of them), so the cost follows the slots made up and the excluded ones
    passed over (at most :data:`MAX_EXCLUDED_PASSED`), not the length of the downtime.
    """
    if rules is None or rules.policy is not CatchupPolicy.ALL:
        return ()
    assert rules.window_s is not None and rules.max_runs is not None
    since, until = between
    # Stretches are (start, end]: one instant before the window's start keeps a slot exactly
    # ``window`` old, one before ``until`` leaves the fired slot out.
    floor = max(since, now - timedelta(seconds=rules.window_s) - _INSTANT)
    found: list[datetime] = []
    passed = 0
    end, span = until - _INSTANT, _FIRST_STRETCH
    while len(found) < rules.max_runs and end > floor:
        start = max(floor, end - span)
        stretch, more = cadence.slots_between(start, end, _STRETCH_SLOTS)
        if more and span > _SHORTEST_STRETCH:
            span /= 4  # too many slots to hold: a shorter stretch, from the same end
            continue
        for slot in reversed(stretch):
            if len(found) == rules.max_runs:
                break
            if excluded(slot) is None:
                found.append(slot)
            else:
                passed += 1
                if passed > MAX_EXCLUDED_PASSED:
                    return tuple(reversed(found))
        end = start
        if not stretch:
            span *= 4  # a long gap between slots (a monthly cron): longer stretches
    return tuple(reversed(found))


def missed_detail(rules: CatchupRules | None, slot: datetime, *, now: datetime) -> str:
    """The record of a missed slot no catch-up runs, saying why not."""
    if rules is None or rules.policy is not CatchupPolicy.ALL:
        return f"{NOT_FIRED}; no make-up run"
    assert rules.window_s is not None
    if now - slot > timedelta(seconds=rules.window_s):
        return f"{NOT_FIRED}; not made up: older than catchup.window ({span(rules.window_s)})"
    return f"{NOT_FIRED}; not made up: older than the newest {rules.max_runs} (catchup.max_runs)"


def made_up_detail(backfill_id: int, *, superseded: bool = False) -> str:
    """The record of a missed slot a catch-up runs (or of a superseded one, whose fire came after
    the next slot was due); the run's own ``fired`` record follows."""
    return f"{'superseded' if superseded else 'missed'}; made up by catch-up #{backfill_id}"
