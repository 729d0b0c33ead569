"""The time zone names a definition may use: canonical IANA zones, spelled exactly.

Canonical: a zone of the IANA database, or a name of its ``zone.tab`` (one per country region).

``ZoneInfo`` also opens whatever file the machine has under that name: ``localtime`` (the host's
own zone), ``posixrules``, ``posix/…`` and ``right/…`` (leap-second) copies, and, on a case-
insensitive file system, ``europe/london``. Those would make a schedule mean different things on
different machines, or two names for one zone. Backward-compatible aliases (``US/Eastern``,
``Asia/Calcutta``, ``GB``) are refused with the canonical name to use instead.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

#: Kept though a link in current tzdata: the documented default, and what everyone writes.
ALWAYS_ALLOWED = frozenset({"UTC"})
#: A zone in the database that stands for no place ("local time is unknown").
NOT_A_PLACE = frozenset({"Factory"})


@cache
def _tzdata() -> tuple[frozenset[str], dict[str, str], dict[str, str]]:
    """Zone names, alias → zone and case-folded name → zone, from the ``tzdata`` package's
    compiler input (the package is a dependency, so every machine has the same list)."""
    data = resources.files("tzdata").joinpath("zoneinfo")
    zones: set[str] = set()
    links: dict[str, str] = {}
    for line in data.joinpath("tzdata.zi").read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "Z":
            zones.add(parts[1])
        elif len(parts) == 3 and parts[0] == "L":
            links[parts[2]] = parts[1]
    # zone.tab names one zone per country region; since 2022 some of them (Europe/Oslo) are
    # links in tzdata.zi to a zone of another country that shares its clocks, yet are the
    # names people in that country use: canonical too.
    for line in data.joinpath("zone.tab").read_text(encoding="utf-8").splitlines():
        parts = line.split("\t")
        if len(parts) >= 3 and not line.startswith("#"):
            zones.add(parts[2])
    allowed = frozenset(zones - NOT_A_PLACE) | ALWAYS_ALLOWED
    return allowed, links, {z.casefold(): z for z in allowed}


def canonical_zone_problem(name: str) -> str | None:
    """Why ``name`` is not a canonical IANA zone, or ``None`` when it is one."""
    zones, links, folded = _tzdata()
    if name in zones:
        return None
    if name in links:
        return f"{name!r} is an alias; use the canonical zone {links[name]!r}"
    if name.casefold() in folded:
        return f"{name!r} is not spelled as the IANA zone {folded[name.casefold()]!r}"
    return f"{name!r} is not an IANA time zone name (a canonical one, like 'Europe/London' or 'UTC')"
