"""The lengths back from now that the dashboard's filter forms offer as ``since`` (the Audit and
Runs pages): ``24h`` in an address means the last 24 hours as of the page's view."""

from __future__ import annotations

from datetime import datetime, timedelta

from celeryapp.domain.times import iso

#: (value in the address, words in the form).
SINCE_CHOICES = (("1h", "last hour"), ("24h", "last 24 hours"), ("7d", "last 7 days"), ("30d", "last 30 days"))
_LENGTHS = {
    "1h": timedelta(hours=1),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
}


def since_time(value: str | None, now: datetime) -> str | None:
    """``value`` as an ISO time: one of the lengths counted back from ``now``; any other value as
    given (the filter's own check refuses what is not a time)."""
    return iso(now - _LENGTHS[value]) if value in _LENGTHS else value
