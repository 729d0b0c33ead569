"""Login throttling: per user name and per client address, counted in Redis before any hashing.

Every attempt counts when it arrives, not when its password turns out wrong, so a burst of
parallel guesses is cut at the limit instead of all passing the check before the first failure
is counted; a successful login gives its attempts back. Unknown names are counted and locked like
known ones, so a lockout tells nothing about which names exist. The counters live in Redis, shared
by every dashboard process, and expire with their window.
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass

import redis

from celeryapp.interfaces.web.sessions import digest
from celeryapp.messaging import keys
from celeryapp.messaging.redis_client import registered_script

#: Attempts one user name may make in :data:`USER_WINDOW_S` before it is locked out.
USER_ATTEMPTS = 5
#: Seconds of the per-user window (from its first attempt).
USER_WINDOW_S = 15 * 60
#: Seconds a user name stays locked out.
USER_LOCKOUT_S = 15 * 60
#: Attempts one client address may make in :data:`ADDRESS_WINDOW_S`, whatever the names.
ADDRESS_ATTEMPTS = 20
#: Seconds of the per-address window (from its first attempt); the address waits it out.
ADDRESS_WINDOW_S = 5 * 60
#: Prefix length counted as one IPv6 client: a /64 is what one customer line or host is handed,
#: and any address in it is that holder's to use (2**64 of them, one per guess).
IPV6_CLIENT_PREFIX = 64

# Returns {refused, retry_after_ms, newly}: refused 0 (go on), 1 (the user is locked), 2 (the
# address is over its limit); newly is 1 for the attempt that locked it (audited once).
_ADMIT = """
local lock = redis.call('PTTL', KEYS[1])
if lock > 0 then return {1, lock, 0} end
local by_address = redis.call('INCR', KEYS[3])
if by_address == 1 then redis.call('PEXPIRE', KEYS[3], ARGV[5]) end
if by_address > tonumber(ARGV[4]) then
  local first = 0
  if by_address == tonumber(ARGV[4]) + 1 then first = 1 end
  return {2, redis.call('PTTL', KEYS[3]), first}
end
local by_user = redis.call('INCR', KEYS[2])
if by_user == 1 then redis.call('PEXPIRE', KEYS[2], ARGV[2]) end
if by_user > tonumber(ARGV[1]) then
  redis.call('DECR', KEYS[3])
  local newly = 0
  if redis.call('SET', KEYS[1], '1', 'PX', ARGV[3], 'NX') then newly = 1 end
  return {1, redis.call('PTTL', KEYS[1]), newly}
end
return {0, 0, 0}
"""
# A right password: forget the user's attempts, give the address its one back (unless its
# window ended meanwhile: a DECR would leave a key without expiry).
_SUCCEEDED = """
redis.call('DEL', KEYS[1])
if redis.call('PTTL', KEYS[2]) > 0 then redis.call('DECR', KEYS[2]) end
"""


@dataclass(frozen=True)
class Refusal:
    #: ``user`` (the name is locked out) or ``address`` (too many attempts from there).
    scope: str
    retry_after_s: int
    #: This attempt is the one that locked it.
    newly: bool


def address_scope(address: str) -> str:
    """What one client's attempts are counted under: an IPv4 address itself; an IPv6 address's
    /64 (:data:`IPV6_CLIENT_PREFIX`); an IPv4-mapped IPv6 address (``::ffff:192.0.2.1``, a dual-stack
    socket's view of an IPv4 peer) as that IPv4 address; anything else (no address at all) as given."""
    try:
        parsed = ipaddress.ip_address(address.split("%", 1)[0])  # a zone index names no other host
    except ValueError:
        return address
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return str(parsed.ipv4_mapped)
        return str(ipaddress.IPv6Network((parsed, IPV6_CLIENT_PREFIX), strict=False))
    return str(parsed)


class LoginThrottle:
    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def _keys(self, name: str, address: str) -> list[str]:
        who = digest(name)
        return [
            keys.login_lock_key(who),
            keys.login_attempts_key("user", who),
            keys.login_attempts_key("address", digest(address_scope(address))),
        ]

    def admit(self, name: str, address: str) -> Refusal | None:
        """Count this attempt; a :class:`Refusal` when it must not be checked at all."""
        script = registered_script(self.client, _ADMIT)
        limits = [USER_ATTEMPTS, USER_WINDOW_S * 1000, USER_LOCKOUT_S * 1000, ADDRESS_ATTEMPTS, ADDRESS_WINDOW_S * 1000]
        refused, retry_ms, newly = script(keys=self._keys(name, address), args=limits)
        if not refused:
            return None
        return Refusal("user" if refused == 1 else "address", max(1, math.ceil(int(retry_ms) / 1000)), bool(newly))

    def succeeded(self, name: str, address: str) -> None:
        """A right password: the user's attempts are forgotten, the address gets its one back."""
        registered_script(self.client, _SUCCEEDED)(keys=self._keys(name, address)[1:])
