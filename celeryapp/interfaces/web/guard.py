"""Whether a login may be tried, and trying it: the throttle first, then the password check in
its own pool, every failure and lockout on the audit trail.

A name that is no account's is checked against a dummy entry of the same cost, on the same path,
so the answer takes as long and costs as much as a known name's wrong password.
"""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy.exc import SQLAlchemyError

from celeryapp.config import Settings
from celeryapp.interfaces.web import throttle
from celeryapp.interfaces.web.auth import WebUser, check_password, dummy_password
from celeryapp.interfaces.web.hashing import HashPool
from celeryapp.interfaces.web.throttle import LoginThrottle, Refusal
from celeryapp.messaging.redis_client import get_redis
from celeryapp.states import AuditAction, AuditSource
from models import transaction
from models.audit import record_audit

logger = logging.getLogger(__name__)
#: Seconds every failed login takes, counted from the request's start: known and unknown names,
#: fast and slow checks alike (the check's own time is part of it, not added on top).
FAILED_LOGIN_FLOOR_S = 1.0


def failure_pad_s(elapsed_s: float, floor_s: float = FAILED_LOGIN_FLOOR_S) -> float:
    """How long a failed login still waits, ``elapsed_s`` after its request began."""
    return max(0.0, floor_s - elapsed_s)


class LoginGuard:
    def __init__(self, settings: Settings, users: dict[str, WebUser]) -> None:
        self.users = users
        self.database_url = settings.database_url
        self.throttle = LoginThrottle(get_redis(settings.broker_url))
        self.pool = HashPool()
        self.dummy = dummy_password(users)

    def admit(self, name: str, address: str) -> Refusal | None:
        """Count the attempt (raises :class:`redis.RedisError`); a refusal answers 429 unchecked."""
        if self.pool.full:
            return Refusal("busy", 1, newly=False)
        return self.throttle.admit(name, address)

    async def refused(self, name: str, address: str, refusal: Refusal) -> None:
        if not refusal.newly:
            return
        if refusal.scope == "user":
            why = f"{throttle.USER_ATTEMPTS} attempts in {throttle.USER_WINDOW_S // 60} min"
        else:
            why = f"{throttle.ADDRESS_ATTEMPTS} attempts from {address} in {throttle.ADDRESS_WINDOW_S // 60} min"
        logger.warning("web: login of %r from %s locked out for %d s: %s", name, address, refusal.retry_after_s, why)
        detail = {"scope": refusal.scope, "address": address, "retry_after_s": refusal.retry_after_s}
        await asyncio.get_running_loop().run_in_executor(
            None, self._audit, AuditAction.LOCKED_OUT, name, f"{why}; locked for {refusal.retry_after_s} s", detail
        )

    async def check(self, name: str, password: str, address: str) -> WebUser | None:
        """The user, if ``password`` is theirs (raises :class:`~.hashing.PoolFull`)."""
        user = self.users.get(name)
        stored = self.dummy if user is None else user.password

        def job() -> bool:
            valid = check_password(stored, password) and user is not None
            if not valid:
                detail = {"address": address, "known_user": user is not None}
                self._audit(AuditAction.LOGIN_FAILED, name, f"failed login from {address}", detail)
            return valid

        if not await self.pool.run(job):
            return None
        assert user is not None
        self.throttle.succeeded(name, address)
        return user

    def _audit(self, action: AuditAction, name: str, reason: str, detail: dict[str, object]) -> None:
        try:
            with transaction(self.database_url) as session:
                record_audit(
                    session,
                    actor=name or "(no name)",
                    source=AuditSource.WEB,
                    action=action,
                    schedule_name=None,
                    reason=reason,
                    detail=detail,
                )
        except SQLAlchemyError as exc:
            # The login's answer does not wait on the trail; the log keeps what it lost.
            logger.error("web: audit row %s for %r not written: %s", action.value, name, exc)
