"""A step runner's patience with the database: a claim or an outcome is tried again while the
database is away (restarted, failed over, behind a pooler that restarted), for as long as a routine
outage lasts, and given up at once when the database refuses the statement itself."""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from celery.exceptions import SoftTimeLimitExceeded
from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

logger = logging.getLogger(__name__)

#: Seconds a runner keeps trying to claim its attempt, and to record its outcome, while the
#: database does not answer (restarts and failovers of 10-60 s are routine). Its pickup lease or
#: heartbeat is kept meanwhile, so recovery neither sends the attempt again nor takes it for lost.
#: A warm shutdown waits for it; a worker killed meanwhile is a lost worker to recovery.
DATABASE_PATIENCE_S = 600.0
#: Pause after the first failed try; doubled after each, up to ``RETRY_PAUSE_MAX_S``, with jitter
#: (half of it at random) so that the workers of a fleet do not come back in step.
RETRY_PAUSE_FIRST_S = 0.1
RETRY_PAUSE_MAX_S = 2.0
#: A database still away is logged (WARNING) at the first failure and then this often, not every try.
RETRY_LOG_EVERY_S = 30.0


def transient(exc: Exception) -> bool:
    """A database that is away or busy (refused, reset, timed out, locked, a deadlock), not a
    statement it refuses: only the first goes away by trying again."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    # The step's soft time limit, falling while its runner waits: the step is over (or has not
    # started), and the runner's bookkeeping goes on until the hard limit.
    return isinstance(
        exc, OperationalError | InterfaceError | DisconnectionError | PoolTimeoutError | SoftTimeLimitExceeded
    )


_T = TypeVar("_T")


def patiently(what: str, once: Callable[[], _T]) -> _T | Exception:
    """``once()`` until it succeeds, for up to ``DATABASE_PATIENCE_S`` while the database is away;
    its last error once patience ran out or the error is not one that trying again can cure."""
    started = time.monotonic()
    pause_s = RETRY_PAUSE_FIRST_S
    tries = 0
    logged_at: float | None = None
    while True:
        tries += 1
        try:
            result = once()
        except Exception as exc:
            now = time.monotonic()
            if not transient(exc):
                logger.exception("%s failed; not tried again", what)
                return exc
            if now - started >= DATABASE_PATIENCE_S:
                logger.critical(
                    "%s: the database has not answered for %.0fs (%s tries); given up", what, now - started, tries
                )
                return exc
            if logged_at is None or now - logged_at >= RETRY_LOG_EVERY_S:
                logged_at = now
                logger.warning(
                    "%s failed (%s tries in %.0fs; tried again for up to %.0fs): %s",
                    what,
                    tries,
                    now - started,
                    DATABASE_PATIENCE_S,
                    exc,
                )
            with contextlib.suppress(SoftTimeLimitExceeded):  # see transient
                time.sleep(min(pause_s / 2 + random.uniform(0, pause_s / 2), started + DATABASE_PATIENCE_S - now))
            pause_s = min(pause_s * 2, RETRY_PAUSE_MAX_S)
            continue
        if tries > 1:
            logger.warning("%s succeeded after %s tries in %.1fs", what, tries, time.monotonic() - started)
        return result
