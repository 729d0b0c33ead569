"""Dashboard sessions: the session cookie, and who the request's cookie says is logged in.

The login and logout pages (web/login.py) start and end a session here; every page asks
:func:`current_user`.
"""

from __future__ import annotations

import hashlib
import hmac

import tornado.web

from celeryapp.interfaces.web.auth import WebUser

SESSION_COOKIE = "chordbeat_session"
#: Days a login lasts.
SESSION_DAYS = 1


def session_stamp(user: WebUser) -> str:
    """Part of the session cookie that changes with the user's password entry and role."""
    return hashlib.sha256(f"{user.role.value}:{user.password}".encode()).hexdigest()[:16]


def current_user(handler: tornado.web.RequestHandler, users: dict[str, WebUser]) -> WebUser | None:
    """The user the request's session cookie names, if that session still holds."""
    raw = handler.get_signed_cookie(SESSION_COOKIE, max_age_days=SESSION_DAYS)
    if raw is None:
        return None
    name, _, stamp = raw.decode("utf-8", "replace").rpartition(":")
    user = users.get(name)
    # A user removed from the configuration, or whose password changed, is logged out.
    return user if user is not None and hmac.compare_digest(stamp, session_stamp(user)) else None


def start_session(handler: tornado.web.RequestHandler, user: WebUser) -> None:
    handler.set_signed_cookie(
        SESSION_COOKIE,
        f"{user.name}:{session_stamp(user)}",
        expires_days=SESSION_DAYS,
        httponly=True,
        samesite="Strict",
        secure=handler.request.protocol == "https",
    )


def end_session(handler: tornado.web.RequestHandler) -> None:
    handler.clear_cookie(SESSION_COOKIE)
