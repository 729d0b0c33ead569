"""The deadline watch: late runs, runs predicted late, slots beat never fired (placeholder until built)."""

from __future__ import annotations

from datetime import datetime


def watch(database_url: str, now: datetime) -> int:
    """Raise the alerts whose deadline passed by ``now``; how many were raised."""
    return 0
