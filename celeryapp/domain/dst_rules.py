"""A schedule's own DST rule (the definition's ``dst``): which pass of a repeated wall time a cron
fires in, and whether a wall time that does not exist fires at the transition or not at all.

``{"repeated": "first" | "last" | "both", "missing": "shift" | "skip"}``. A key left out keeps the
default for its case (:mod:`celeryapp.domain.cron`'s docstring): a missing time shifts to the
transition; a repeated time fires at its first pass, or in both when the hour field starts with
``*``. Only cron schedules take it: an interval counts absolute time, which no transition changes.

Pure: no I/O. :mod:`celeryapp.domain.dst_fields` reads it from a definition.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo
from enum import StrEnum
from typing import Any


class Repeated(StrEnum):
    """Which pass of a wall time the clocks go through twice (fall back) fires."""

    FIRST = "first"
    LAST = "last"
    BOTH = "both"


class Missing(StrEnum):
    """What a wall time the clocks skip (spring forward) does."""

    #: Fires at the transition, the first instant after it; several such times collapse into one.
    SHIFT = "shift"
    #: Does not fire.
    SKIP = "skip"


@dataclass(frozen=True)
class DstRules:
    """The definition's ``dst``; ``None`` for a key keeps the default rule for that case."""

    repeated: Repeated | None = None
    missing: Missing | None = None

    def folds(self, every_hour: bool) -> tuple[int, ...]:
        """The passes (``fold`` values) a repeated wall time fires in; ``every_hour``: the cron's
        hour field starts with ``*``, which by default follows the clock through both."""
        chosen = self.repeated or (Repeated.BOTH if every_hour else Repeated.FIRST)
        return {Repeated.FIRST: (0,), Repeated.LAST: (1,), Repeated.BOTH: (0, 1)}[chosen]

    @property
    def skips_missing(self) -> bool:
        return self.missing is Missing.SKIP

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.repeated is not None:
            out["repeated"] = self.repeated.value
        if self.missing is not None:
            out["missing"] = self.missing.value
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any] | None) -> DstRules | None:
        """Rebuild from :meth:`to_json` output (as stored); ``None`` stays ``None``. Raises
        ``ValueError`` for anything else (a stored beat entry is read with it)."""
        if raw is None:
            return None
        if not isinstance(raw, Mapping) or set(raw) - {"repeated", "missing"}:
            raise ValueError(f"not a dst object: {raw!r:.80}")
        repeated, missing = raw.get("repeated"), raw.get("missing")
        return cls(
            repeated=None if repeated is None else Repeated(repeated),
            missing=None if missing is None else Missing(missing),
        )


#: Default rules: what a schedule without ``dst`` follows.
DEFAULT = DstRules()


def transition_between(before: datetime, after: datetime, zone: tzinfo) -> datetime:
    """First whole second in (before, after] whose UTC offset is ``after``'s (one change between)."""
    target = after.astimezone(zone).utcoffset()
    low, high = before, after
    while high - low > timedelta(seconds=1):
        mid = (low + (high - low) / 2).replace(microsecond=0)
        if mid <= low:
            break
        if mid.astimezone(zone).utcoffset() == target:
            high = mid
        else:
            low = mid
    return high
