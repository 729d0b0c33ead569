"""Message expiry judged by the reference clock, not by the receiving host's.

A message's ``expires`` is an absolute time written by its sender. Celery's worker compares it with
its own host's clock, so a worker 35 s ahead discarded every periodic message whose expiry was
shorter than that (recovery then never ran there), and one behind kept expired fires. Our senders
write it by the reference clock (:meth:`ChordbeatCelery.now`); our workers read it by the same.
"""

from __future__ import annotations

from celery import Task
from celery.worker.request import Request
from celery.worker.state import revoked as revoked_tasks

from celeryapp.clock import clock


class ReferenceClockRequest(Request):  # type: ignore[misc]
    """Celery's worker-side request, its expiry compared with the reference clock."""

    def maybe_expire(self) -> bool | None:
        expires = self.expires
        if not expires or expires.tzinfo is None:
            # A naive time is the sender's local time: nothing better than Celery's own reading.
            return super().maybe_expire()  # type: ignore[no-any-return]
        if clock.now() > expires:
            revoked_tasks.add(self.id)
            return True
        return None


class ReferenceClockTask(Task):  # type: ignore[misc]
    """The base of every chordbeat task (the app's ``task_cls``)."""

    Request = f"{__name__}:ReferenceClockRequest"
