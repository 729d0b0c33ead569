"""Dashboard accounts: who may log in, and whether they may act or only look.

``CHORDBEAT_WEB_USERS`` holds ``name:role:password`` entries separated by commas. ``role`` is
``admin`` (may run, pause, resume and cancel) or ``viewer`` (may look). ``password`` is a hash made
by ``chordbeat web-password`` (``pbkdf2_sha256:iterations:salt:hex``; no ``$``, so
compose and shells leave it alone) or, for a local setup,
the password itself.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from enum import StrEnum

from celeryapp.errors import ConfigError

HASH_SCHEME = "pbkdf2_sha256"
#: OWASP's 2023 figure for PBKDF2-HMAC-SHA256.
HASH_ITERATIONS = 600_000
#: Shortest accepted cookie-signing secret (characters).
MIN_SECRET_CHARS = 32


class Role(StrEnum):
    ADMIN = "admin"
    VIEWER = "viewer"


@dataclass(frozen=True)
class WebUser:
    name: str
    role: Role
    password: str  # a ``pbkdf2_sha256:…`` hash, or the plain password

    @property
    def may_act(self) -> bool:
        return self.role is Role.ADMIN

    def check(self, password: str) -> bool:
        return check_password(self.password, password)


def hash_password(password: str, *, iterations: int = HASH_ITERATIONS) -> str:
    salt = secrets.token_hex(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt.encode(), iterations).hex()
    return f"{HASH_SCHEME}:{iterations}:{salt}:{digest}"


def _hashed(stored: str) -> tuple[int, str, str] | None:
    """Iterations, salt and digest of a hash entry; None for a plain password."""
    parts = stored.split(":")
    if len(parts) == 4 and parts[0] == HASH_SCHEME and parts[1].isdigit():
        return int(parts[1]), parts[2], parts[3]
    return None


def check_password(stored: str, given: str) -> bool:
    hashed = _hashed(stored)
    if hashed is not None:
        iterations, salt, expected = hashed
        digest = hashlib.pbkdf2_hmac("sha256", given.encode(), salt.encode(), iterations).hex()
        return hmac.compare_digest(digest, expected)
    return hmac.compare_digest(stored.encode(), given.encode())


def dummy_password(users: dict[str, WebUser]) -> str:
    """A password entry nobody knows that costs as much to check as the accounts' dearest: an
    unknown name is checked against it, so its answer takes the time a known name's wrong password
    takes (a plain random string when no account is hashed)."""
    rounds = [hashed[0] for user in users.values() if (hashed := _hashed(user.password)) is not None]
    secret = secrets.token_hex(16)
    return hash_password(secret, iterations=max(rounds)) if rounds else secret


def parse_users(raw: str) -> dict[str, WebUser]:
    """The accounts of ``CHORDBEAT_WEB_USERS``; a malformed entry is a :class:`ConfigError` that
    names it (without its password)."""
    users: dict[str, WebUser] = {}
    for number, entry in enumerate((e.strip() for e in raw.split(",")), 1):
        if not entry:
            continue
        name, _, rest = entry.partition(":")
        role, _, password = rest.partition(":")
        where = f"CHORDBEAT_WEB_USERS entry {number} ({name!r})"
        if not name or not password:
            raise ConfigError(f"{where}: expected name:role:password")
        if role not in {r.value for r in Role}:
            raise ConfigError(f"{where}: role must be admin or viewer, got {role!r}")
        if name in users:
            raise ConfigError(f"{where}: the name appears twice")
        users[name] = WebUser(name, Role(role), password)
    return users


def check_auth_config(users_raw: str, secret: str) -> dict[str, WebUser]:
    """The accounts, or why the dashboard must not start: it never runs without a login."""
    users = parse_users(users_raw)
    if not users:
        raise ConfigError(
            "CHORDBEAT_WEB_USERS: no accounts; the dashboard does not run without a login "
            "(e.g. 'ops:admin:<hash from chordbeat web-password>')"
        )
    if len(secret) < MIN_SECRET_CHARS:
        raise ConfigError(
            f"CHORDBEAT_WEB_SECRET: at least {MIN_SECRET_CHARS} random characters sign the session cookies, "
            f"got {len(secret)}"
        )
    return users
