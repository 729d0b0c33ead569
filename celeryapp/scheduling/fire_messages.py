"""Beat's fire messages: the due entries' slots, a batch a message, none for a schedule whose last
fire is still queued (:mod:`celeryapp.scheduling.queued_fires`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from kombu.utils.uuid import uuid

from celeryapp.domain.limits import MAX_FIRE_BATCH
from celeryapp.domain.names import CONTROL_QUEUE
from celeryapp.messaging.redis_client import get_redis
from celeryapp.runtime import Runtime
from celeryapp.scheduling.beat_entries import chunks, short_name_list
from celeryapp.scheduling.entry_batches import move_on
from celeryapp.scheduling.queued_fires import QueuedFires
from celeryapp.scheduling.stored_entry import ScheduleEntry, fire_of

logger = logging.getLogger(__name__)

BATCH_FIRE_TASK = "chordbeat.fire_batch"
#: Seconds between two looks at whether the fires that hold slots back were taken.
RELEASE_LOOK_S = 1.0


def _queued_marker(
    batch: tuple[str, Sequence[tuple[dict[str, str], datetime | None]]],
) -> tuple[str, list[str]] | None:
    """What marks a fire message queued: its id and its regular slots' schedules (a retry has no
    expiry, and is not held back)."""
    message_id, slots = batch
    regular = [fire["name"] for fire, expires in slots if expires is not None]
    return (message_id, regular) if regular else None


class FireSender:
    """Sends a beat's fires; remembers which message holds each schedule's last one."""

    def __init__(self) -> None:
        self._queued = QueuedFires()
        self._looked_at = float("-inf")

    def send(
        self, app: Runtime, entries: list[ScheduleEntry], *, producer: Any, drop: Callable[[str, str], None]
    ) -> None:
        """Fire the due schedule entries, :data:`~celeryapp.domain.limits.MAX_FIRE_BATCH` slots a
        message: a message each cost beat a few round trips and the workers a transaction per
        slot (docs/performance.md, "Why 10,000 schedules due at once start in time").

        As RedBeat does, the entries move on first (one command per thousand): a beat dying before
        it sent them loses those fires, never doubles them; the lost-slot re-fire repairs that.
        A schedule whose last fire still waits in the queue is not fired again (:mod:`.queued_fires`).
        """
        now = app.now()
        slots: list[tuple[dict[str, str], datetime | None]] = []
        moves: list[tuple[str, str, float]] = []
        client = get_redis(app.settings.redbeat_url)
        # The markers live beside the messages, in the broker's Redis: often the same client.
        markers = get_redis(app.settings.broker_url)
        names = [name for entry in entries if isinstance(name := entry.kwargs.get("name"), str)]
        for entry in entries:
            try:
                name = entry.kwargs.get("name")
                slot = fire_of(entry.schedule, entry.last_run_at, name, now) if isinstance(name, str) else None
                meta, score = entry.moved_on(now)
            except Exception as exc:
                drop(entry.key, f"its slot cannot be computed ({exc!r})")
                continue
            moves.append((entry.key, meta, score))
            if slot is not None:
                slots.append(slot)
            else:
                # Not written by chordbeat: its slot would get the whole message refused.
                logger.warning("beat: entry %s names no schedule; not fired", entry.name)
        move_on(client, app.redbeat_conf.schedule_key, moves)
        with markers.pipeline(transaction=False) as pipe:
            asked = self._queued.ask(pipe, names)
            answers = pipe.execute() if asked else []
        # A regular slot whose schedule's last fire still waits is held, unfired; a retry (no
        # expiry) is always sent.
        waiting = self._queued.still_queued(names, asked, answers)
        if waiting:
            logger.warning(
                "beat: the last fires of %s are still queued (is a control worker running?); not fired again",
                short_name_list(sorted(waiting)),
            )
            self._queued.hold((f, e) for f, e in slots if e is not None and f["name"] in waiting)
            slots = [(fire, expires) for fire, expires in slots if expires is None or fire["name"] not in waiting]
        self._publish(app, slots, producer, markers)

    def release(self, app: Runtime, *, producer: Any) -> None:
        """Fire the held slots whose schedule's last fire a worker has taken (looked at once a
        second at most, and only while slots are held)."""
        if not self._queued.holding or time.monotonic() - self._looked_at < RELEASE_LOOK_S:
            return
        self._looked_at = time.monotonic()
        markers = get_redis(app.settings.broker_url)
        with markers.pipeline(transaction=False) as pipe:
            asked = self._queued.ask_held(pipe)
            replies = pipe.execute()
        released = self._queued.released(asked, replies, app.now())
        if released:
            logger.warning(
                "beat: the queued fires of %s were taken; firing their latest passed slots",
                short_name_list(sorted(fire["name"] for fire, _ in released)),
            )
            self._publish(app, list(released), producer, markers)

    def _publish(
        self, app: Runtime, slots: list[tuple[dict[str, str], datetime | None]], producer: Any, markers: Any
    ) -> None:
        batches = [(uuid(), batch) for batch in chunks(slots, MAX_FIRE_BATCH)]
        self._queued.sending(markers, [marker for marker in map(_queued_marker, batches) if marker])
        for message_id, batch in batches:
            names = [fire["name"] for fire, _ in batch]
            expiries = [expires for _, expires in batch]
            # A message lives as long as its longest-lived slot; the worker supersedes the others.
            options = {"expires": max(e for e in expiries if e is not None)} if None not in expiries else {}
            logger.info("beat: firing %s", short_name_list(names))
            try:
                app.send_task(
                    BATCH_FIRE_TASK,
                    kwargs={"fires": [fire for fire, _ in batch]},
                    queue=CONTROL_QUEUE,
                    ignore_result=True,
                    producer=producer,
                    headers={"celery_beat_task": True},
                    task_id=message_id,
                    # What Flower and the logs show of the message. Celery's own is a repr of
                    # every slot (then cut at 1 KiB), a cost per fire that beat's log line's
                    # names spare (docs/scaling.md, "Beat's CPU and its entries' bytes").
                    kwargsrepr=f"{{'fires': <{len(batch)} slots of {short_name_list(names)}>}}",
                    **options,
                )
            except Exception:
                self._queued.not_sent(markers, message_id)
                logger.exception(
                    "beat: sending the fires of %s failed; the lost-slot re-fire repairs them", short_name_list(names)
                )
