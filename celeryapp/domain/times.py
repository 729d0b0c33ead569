"""How chordbeat writes an instant: ISO 8601 in UTC with a ``Z``, as the contract shows."""

from __future__ import annotations

from datetime import datetime


def iso(value: datetime | None) -> str | None:
    """ISO 8601 in UTC with a ``Z``, to the millisecond."""
    if value is None:
        return None
    return value.isoformat(timespec="milliseconds").replace("+00:00", "Z")
