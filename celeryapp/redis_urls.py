"""Redis URLs as chordbeat takes them: one server, or a list of Sentinels in Celery's spelling.

``sentinel://[:password@]host:port[/db];sentinel://host:port[/db];...`` names the Sentinels that
watch the primary; the password and database are the primary's (the Sentinels themselves are asked
without one). Every client (broker, results, RedBeat, chordbeat's own) reads the same list, so the
rules are checked once at start-up: what one library would take and another silently read otherwise
(a password only on the second entry, two databases) is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple
from urllib.parse import unquote, urlsplit

from redis.connection import parse_url

SENTINEL_SCHEME = "sentinel"
#: The monitored primary's name the Sentinels know, unless ``CHORDBEAT_SENTINEL_MASTER`` says otherwise.
DEFAULT_SENTINEL_MASTER = "mymaster"
#: The schemes of a single Redis server's URL (redis-py's).
SERVER_SCHEMES = ("redis", "rediss", "unix")
_DB_PATH = re.compile(r"^/?(\d{0,5})$")


@dataclass(frozen=True)
class Sentinels:
    """A parsed Sentinel list."""

    #: ``(host, port)`` of each Sentinel, in the order given.
    addresses: tuple[tuple[str, int], ...]
    #: The primary's database number.
    db: int = 0
    username: str | None = None
    password: str | None = None

    def display(self, scheme: str = SENTINEL_SCHEME) -> str:
        """The list without credentials, each entry with ``scheme``."""
        return ";".join(f"{scheme}://{_host(host)}:{port}/{self.db}" for host, port in self.addresses)


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def is_sentinel(url: str) -> bool:
    return url.startswith(f"{SENTINEL_SCHEME}://")


class _Entry(NamedTuple):
    host: str
    port: int
    db: int | None
    credentials: tuple[str | None, str | None] | None


def _entry(number: int, text: str) -> _Entry:
    where = f"entry {number} of the Sentinel list"
    if not text.strip():
        raise ValueError(f"{where} is empty")
    parts = urlsplit(text.strip())
    if parts.scheme != SENTINEL_SCHEME:
        raise ValueError(f"{where} is not a sentinel:// URL (one list cannot mix schemes)")
    if parts.query or parts.fragment:
        raise ValueError(f"{where} has options ('?' or '#'), which a Sentinel list does not take")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        raise ValueError(f"{where}: the port is not a number from 1 to 65535") from None
    if not host:
        raise ValueError(f"{where} has no host")
    if port is None:
        raise ValueError(f"{where} has no port (host:port, such as 127.0.0.1:26379)")
    if port == 0:
        raise ValueError(f"{where}: the port is not a number from 1 to 65535")
    db = _DB_PATH.match(parts.path)
    if db is None:
        raise ValueError(f"{where}: the path is not a database number (/0, /1, ...)")
    credentials = None
    if parts.username or parts.password:
        credentials = (unquote(parts.username or "") or None, unquote(parts.password or "") or None)
    return _Entry(host, port, int(db[1]) if db[1] else None, credentials)


def parse_sentinels(url: str) -> Sentinels:
    """The Sentinel list in ``url``; :class:`ValueError` (without the URL, which may hold a password) if unusable."""
    first, *others = (_entry(number, text) for number, text in enumerate(url.split(";"), start=1))
    # Celery's result backend and kombu take the first entry's database and password: one given
    # elsewhere only would be used by some clients and not by others.
    db = first.db or 0
    if any(other.db not in (None, db) for other in others):
        raise ValueError("only the first entry of the Sentinel list names the database (others repeat it or none)")
    credentials = first.credentials or (None, None)
    if any(other.credentials not in (None, credentials) for other in others):
        raise ValueError("only the first entry of the Sentinel list may carry the password (others repeat it or none)")
    addresses = tuple((entry.host, entry.port) for entry in (first, *others))
    return Sentinels(addresses, db, *credentials)


def check_redis_url(url: str) -> None:
    """:class:`ValueError` (without the URL) unless ``url`` is a Redis URL or a Sentinel list."""
    if is_sentinel(url):
        parse_sentinels(url)
        return
    scheme = url.partition("://")[0]
    if scheme not in SERVER_SCHEMES:
        raise ValueError(f"expected a redis://, rediss://, unix:// or sentinel:// URL, got scheme {scheme!r}")
    if ";" in url:
        raise ValueError("a list separated by ';' is only for sentinel:// URLs (one list cannot mix schemes)")
    try:
        options = parse_url(url)  # type: ignore[no-untyped-call]
        port = urlsplit(url).port
    except ValueError as exc:
        raise ValueError(str(exc)) from None
    if scheme != "unix" and not options.get("host"):
        raise ValueError("the URL has no host")
    if port == 0:
        raise ValueError("the port is not a number from 1 to 65535")
