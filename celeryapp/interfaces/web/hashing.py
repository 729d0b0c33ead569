"""Password checks in a small pool of their own, bounded.

A PBKDF2 check takes a fifth of a second of CPU. Run in the event loop's default executor, a
burst of guesses filled the threads that page reads use too (reads went from 0.23 to 3.4 s); here
they wait only for each other, and past :data:`HASH_WAITING` waiting the login is refused at once
(429) instead of queueing without end.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from celeryapp.errors import ChordbeatError

#: Threads checking passwords at once (pbkdf2_hmac releases the GIL: each takes a core).
HASH_THREADS = 2
#: Checks that may wait for a thread; one more is refused.
HASH_WAITING = 8
T = TypeVar("T")


class PoolFull(ChordbeatError):
    """Every hashing thread is busy and the waiting line is full."""


class HashPool:
    def __init__(self, threads: int = HASH_THREADS, waiting: int = HASH_WAITING) -> None:
        self.bound = threads + waiting
        self.pending = 0  # touched from the event loop only
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="login-hash")

    @property
    def full(self) -> bool:
        return self.pending >= self.bound

    async def run(self, fn: Callable[[], T]) -> T:
        if self.full:
            raise PoolFull
        self.pending += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn)
        finally:
            self.pending -= 1
