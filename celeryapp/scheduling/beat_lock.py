"""Who holds beat's lock: the lock's token names its holder.

RedBeat's lock is a redis-py lock whose value is a random token only its holder knows; a token
that is the holder's ``host pid N`` followed by a random part stays as unguessable and lets the
Health page say which beat fires the schedules (a beat from before this names no one).
"""

from __future__ import annotations

import secrets

from celeryapp.messaging.reference_time import process_name

#: Between the holder's name and the random part.
_SEPARATOR = " · "


def holder_token() -> str:
    """A new token for this process's attempt at the lock."""
    return f"{process_name()}{_SEPARATOR}{secrets.token_hex(16)}"


def holder_of(token: str | None) -> str | None:
    """The holder a stored token names; ``None`` for a token that names no one (RedBeat's own)."""
    if not token or _SEPARATOR not in token:
        return None
    return token.rsplit(_SEPARATOR, 1)[0][:200]
