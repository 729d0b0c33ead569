"""Dashboard sessions, kept in Redis, and the cookies that carry them.

The session cookie holds only a random id (signed with ``CHORDBEAT_WEB_SECRET``); Redis holds
who it belongs to, under the id's digest, for :data:`SESSION_TTL_S` from the login. Logging out
deletes it, so the cookie replayed later is refused; a session whose user is gone or whose
password entry or role changed (a restart with a new ``CHORDBEAT_WEB_USERS``) is refused and
deleted at its next request.

Redis is not trusted with who is logged in: anyone who can write there could otherwise copy an
admin's session record over a viewer's, or give it a role. Each record is signed (HMAC-SHA256
with a key drawn from ``CHORDBEAT_WEB_SECRET``) over the key it is stored under, the user, the
role, the password entry's stamp and the expiry, so a record edited, moved to another session's
key or kept past its expiry is refused, logged and deleted. The stamp is keyed too: a plain
digest of a password entry would hand Redis readers a fast hash of a plain password.

Over HTTPS (the request's own, or a trusted proxy's ``X-Forwarded-Proto``) every cookie is
``Secure`` and chordbeat's own (session, xsrf, flash) take the ``__Host-`` prefix, which a
browser accepts only with ``Secure``, ``Path=/`` and no ``Domain``: no sibling host or plain-HTTP
page can set or shadow them. Over plain HTTP (``make run`` on loopback) they keep their plain names.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import secrets
from typing import Any, overload

import redis
import tornado.web

from celeryapp.clock import clock
from celeryapp.config import Settings
from celeryapp.interfaces.web.auth import WebUser
from celeryapp.messaging import keys
from celeryapp.messaging.redis_client import get_redis

logger = logging.getLogger(__name__)
SESSION_COOKIE = "chordbeat_session"
#: Seconds a login lasts, from the login (not renewed by use).
SESSION_TTL_S = 24 * 3600
#: Bytes of randomness in a session id.
SESSION_ID_BYTES = 32
#: The names chordbeat's cookies take over HTTPS.
HOST_COOKIES = {
    SESSION_COOKIE: "__Host-chordbeat_session",
    "chordbeat_flash": "__Host-chordbeat_flash",
    "_xsrf": "__Host-chordbeat_xsrf",
}

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def record_key(secret: str) -> bytes:
    """The key session records are signed with: drawn from the cookie secret, apart from the
    cookies' own use of it."""
    return hmac.new(secret.encode(), b"chordbeat session record", hashlib.sha256).digest()


def session_stamp(user: WebUser, key: bytes) -> str:
    """What a session remembers of its user's entry: it changes with the password entry and role."""
    return hmac.new(key, f"{user.role.value}:{user.password}".encode(), hashlib.sha256).hexdigest()[:16]


def record_signature(key: bytes, where: str, held: dict[str, Any]) -> str:
    """The signature of a session record stored at ``where`` (its Redis key)."""
    signed = json.dumps([where, held.get("user"), held.get("role"), held.get("stamp"), held.get("expires")])
    return hmac.new(key, signed.encode(), hashlib.sha256).hexdigest()


def digest(text: str) -> str:
    """How ids and names appear in Redis keys: fixed length, never the value itself."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def trusted(peer: str, proxies: tuple[Network, ...]) -> bool:
    try:
        address = ipaddress.ip_address(peer)
    except ValueError:
        return False
    return any(address in network for network in proxies)


def forwarded_https(peer: str, protocol: str, forwarded_proto: str | None, proxies: tuple[Network, ...]) -> bool:
    """Whether the browser's request came over HTTPS: this connection's own TLS, or the trusted
    proxy's word (its last ``X-Forwarded-Proto`` value; anyone else's header is ignored)."""
    if protocol == "https":
        return True
    if forwarded_proto is None or not trusted(peer, proxies):
        return False
    return forwarded_proto.rsplit(",", 1)[-1].strip().lower() == "https"


def client_address(peer: str, forwarded_for: str | None, proxies: tuple[Network, ...]) -> str:
    """The browser's address: the peer's, or behind a trusted proxy the last ``X-Forwarded-For``
    entry (the one the proxy appended; earlier ones are the client's to invent)."""
    if forwarded_for is None or not trusted(peer, proxies):
        return peer
    last = forwarded_for.rsplit(",", 1)[-1].strip()
    try:
        return str(ipaddress.ip_address(last))
    except ValueError:
        return peer


class Sessions:
    """This dashboard's sessions: its accounts, its Redis, the proxies it trusts."""

    def __init__(self, settings: Settings, users: dict[str, WebUser], secret: str) -> None:
        self.users = users
        self.key = record_key(secret)
        self.redis_url = settings.broker_url
        self.proxies: tuple[Network, ...] = tuple(ipaddress.ip_network(p) for p in settings.web_trusted_proxies)

    def redis(self) -> redis.Redis:
        return get_redis(self.redis_url)

    def current_user(self, handler: tornado.web.RequestHandler) -> WebUser | None:
        """The user the request's session cookie names, if that session still holds."""
        session_id = _cookie_id(handler)
        if session_id is None:
            return None
        key = keys.web_session_key(digest(session_id))
        try:
            raw = self.redis().get(key)
        except redis.RedisError as exc:
            # Nobody is logged in while sessions cannot be read; the login page says why.
            logger.warning("web: sessions unreadable: %s", exc)
            return None
        if raw is None:
            return None
        held = _parse(raw)
        if not hmac.compare_digest(str(held.get("signature")), record_signature(self.key, key, held)):
            # Written by someone holding Redis, not by a dashboard: the session ends here.
            logger.warning(
                "web: a session record (user %.100r, role %.20r) fails its signature: edited or moved in Redis; "
                "session dropped",
                held.get("user"),
                held.get("role"),
            )
            self._forget(key)
            return None
        user = self.users.get(str(held.get("user")))
        if (
            user is None
            or held.get("role") != user.role.value
            or not hmac.compare_digest(str(held.get("stamp")), session_stamp(user, self.key))
            or not isinstance(held.get("expires"), (int, float))
            or held["expires"] <= clock.now().timestamp()
        ):
            self._forget(key)
            return None
        return user

    def start(self, handler: tornado.web.RequestHandler, user: WebUser) -> None:
        """A new session for ``user`` (raises :class:`redis.RedisError` if it cannot be stored)."""
        session_id = secrets.token_urlsafe(SESSION_ID_BYTES)
        key = keys.web_session_key(digest(session_id))
        # The reference clock: any dashboard process, on any host, reads the expiry.
        now = clock.now().timestamp()
        held: dict[str, Any] = {
            "user": user.name,
            "role": user.role.value,
            "stamp": session_stamp(user, self.key),
            "at": now,
            "expires": now + SESSION_TTL_S,
        }
        held["signature"] = record_signature(self.key, key, held)
        self.redis().set(key, json.dumps(held), ex=SESSION_TTL_S)
        handler.set_signed_cookie(
            SESSION_COOKIE, session_id, expires_days=SESSION_TTL_S / 86400, httponly=True, samesite="Strict"
        )

    def end(self, handler: tornado.web.RequestHandler) -> None:
        session_id = _cookie_id(handler)
        if session_id is not None:
            self._forget(keys.web_session_key(digest(session_id)))
        handler.clear_cookie(SESSION_COOKIE)

    def _forget(self, key: str) -> None:
        try:
            self.redis().delete(key)
        except redis.RedisError as exc:
            logger.warning("web: session not deleted: %s", exc)


def _cookie_id(handler: tornado.web.RequestHandler) -> str | None:
    raw = handler.get_signed_cookie(SESSION_COOKIE, max_age_days=SESSION_TTL_S / 86400)
    return None if raw is None else raw.decode("ascii", "replace")


def _parse(raw: Any) -> dict[str, Any]:
    try:
        held = json.loads(raw)
    except ValueError:
        return {}
    return held if isinstance(held, dict) else {}


class SessionCookies(tornado.web.RequestHandler):
    """A handler whose cookies follow the request's protocol (see the module's docstring)."""

    sessions: Sessions
    _https: bool | None = None

    @property
    def over_https(self) -> bool:
        if self._https is None:
            request = self.request
            self._https = forwarded_https(
                request.remote_ip or "",
                request.protocol,
                request.headers.get("X-Forwarded-Proto"),
                self.sessions.proxies,
            )
        return self._https

    @property
    def client_address(self) -> str:
        request = self.request
        return client_address(request.remote_ip or "", request.headers.get("X-Forwarded-For"), self.sessions.proxies)

    @overload
    def get_cookie(self, name: str, default: str) -> str: ...

    @overload
    def get_cookie(self, name: str, default: None = None) -> str | None: ...

    def get_cookie(self, name: str, default: str | None = None) -> str | None:
        return super().get_cookie(HOST_COOKIES.get(name, name) if self.over_https else name, default)

    def set_cookie(  # type: ignore[override]
        self,
        name: str,
        value: str | bytes,
        domain: str | None = None,
        expires: Any = None,
        path: str = "/",
        expires_days: float | None = None,
        **kwargs: Any,
    ) -> None:
        if self.over_https:
            kwargs["secure"] = True
            if name in HOST_COOKIES:
                name, domain, path = HOST_COOKIES[name], None, "/"
        super().set_cookie(name, value, domain, expires, path, expires_days, **kwargs)
