"""Answering the caller of a task message whose body is refused at decoding.

A body nested deeper than :data:`~celeryapp.messaging.serialization.MAX_MESSAGE_DEPTH` is refused
by the worker's decoder, and Celery's consumer logs it and acknowledges it (``on_decode_error``):
the worker lives, but a service call's caller heard nothing and waited out its timeout (60 s).
Its headers were decoded with the envelope, before the body, so its task and id are known: the
caller is answered at once with :class:`~celeryapp.errors.InvalidArgument` naming the argument
(``args``, ``kwargs.<name>``) through the same hook that answers oversized messages.
"""

from __future__ import annotations

from typing import Any

from celery import bootsteps

from celeryapp.errors import InvalidArgument
from celeryapp.messaging.serialization import MAX_MESSAGE_DEPTH, TooDeep, answer_refused, task_argument


class AnswerRefusedBodies(bootsteps.StartStopStep):  # type: ignore[misc]
    """Wraps the consumer's ``on_decode_error`` (looked up on the consumer at each message, so
    replacing it holds for the task handler made before this step starts)."""

    requires = {"celery.worker.consumer.tasks:Tasks"}

    def start(self, parent: Any) -> None:
        logged = parent.on_decode_error
        if getattr(logged, "answers_refused_bodies", False):
            return  # a restarted consumer keeps the one wrapper

        def on_decode_error(message: Any, exc: Exception) -> None:
            try:
                logged(message, exc)  # logged and acknowledged: gone, as before
            finally:
                refused = too_deep(exc)
                if refused is not None:
                    reason = f"nested more than {MAX_MESSAGE_DEPTH} levels deep"
                    error = InvalidArgument(task_argument(refused.path), reason)
                    answer_refused(getattr(message, "headers", None), error)

        on_decode_error.answers_refused_bodies = True  # type: ignore[attr-defined]
        parent.on_decode_error = on_decode_error


def too_deep(exc: BaseException) -> TooDeep | None:
    """The :class:`TooDeep` behind ``exc``: kombu's ``loads`` wraps what the decoder raised in a
    new :class:`~kombu.exceptions.DecodeError` holding it as its argument."""
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None or isinstance(seen, TooDeep):
            return seen
        held = seen.args[0] if seen.args and isinstance(seen.args[0], BaseException) else None
        seen = held or seen.__cause__ or seen.__context__
    return None
