"""Telling the log that Redis is away, without a line for every try.

Beat tries Redis again every second or so for as long as it is away: a warning each time filled
the log (3,600 lines an hour of outage) and buried everything else. An outage is said at its
first failure, then every :data:`WARN_EVERY_S` with how long it has lasted, and once when Redis
answers again.
"""

from __future__ import annotations

import logging
import math
import time

#: While Redis stays away, a warning at the first failure and then this often.
WARN_EVERY_S = 30.0


class RedisOutage:
    """The log of one thing beat keeps trying (start-up, the lock, a tick) while Redis is away."""

    def __init__(self, logger: logging.Logger, trying: str, then: str) -> None:
        #: The warning's text (``"beat: cannot reach Redis for the lock; retrying"``).
        self.trying = trying
        #: What happens once Redis answers (``"starting"``).
        self.then = then
        self.logger = logger
        self._began: float | None = None
        self._warned_at = -math.inf
        self._tries = 0

    def failed(self, exc: BaseException) -> None:
        now = time.monotonic()
        if self._began is None:
            self._began, self._warned_at, self._tries = now, -math.inf, 0
        self._tries += 1
        if now - self._warned_at >= WARN_EVERY_S:
            self._warned_at = now
            self.logger.warning("%s (%s tries in %.0f s so far): %s", self.trying, self._tries, now - self._began, exc)

    def answered(self) -> None:
        """Redis answered: the outage, if there was one, is over (said once)."""
        if self._began is None:
            return
        self.logger.info(
            "beat: Redis answered after %s tries in %.1f s; %s", self._tries, time.monotonic() - self._began, self.then
        )
        self._began = None
