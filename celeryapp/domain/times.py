"""How chordbeat writes instants and lengths of time in what it stores and answers: ISO 8601 in UTC
for machines (the contract's), and a length as a slot's or a run's recorded detail says it (its two
largest units: ``0.4 s``, ``3 min 4 s``, ``2 d 3 h``). How people are shown times (an instant in a
schedule's zone and the viewer's, how long ago) is :mod:`celeryapp.interfaces.time_words`.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

#: Shown where there is no time or length to show.
NOTHING = "-"


def iso(value: datetime | None, *, timespec: str = "milliseconds") -> str | None:
    """ISO 8601 in UTC with a ``Z``, to the millisecond (the contract's) unless ``timespec`` says
    otherwise (the dashboard shows seconds)."""
    if value is None:
        return None
    if value.tzinfo is not None:
        value = value.astimezone(UTC)
    return value.isoformat(timespec=timespec).replace("+00:00", "Z")


def parse_time(value: str | None) -> datetime | None:
    """An ISO 8601 timestamp of the contract (UTC with a ``Z``); one without a zone is UTC."""
    if not value:
        return None
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def span(seconds: float | None) -> str:
    """A length of time for people, its sign dropped: ``0.4 s``, ``5 s``, ``3 min 4 s``, ``2 d 3 h``."""
    if seconds is None or not math.isfinite(seconds):
        return NOTHING
    seconds = abs(seconds)
    if seconds < 10:
        return f"{seconds:.0f} s" if seconds == int(seconds) else f"{seconds:.1f} s"
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{n} {unit}" for n, unit in ((days, "d"), (hours, "h"), (minutes, "min"), (secs, "s")) if n]
    return " ".join(parts[:2])
