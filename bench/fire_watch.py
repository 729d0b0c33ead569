"""When beat's fire messages reached the control queue: beat's own lateness, apart from the workers'.

A slot's fire lateness (its run started - the slot) adds beat's delay (the tick that found it
due, the message published) to the workers' (the message waiting in the queue, the batch's
transaction). :class:`FireWatch` looks at the newest messages of the control queue every
:data:`LOOK_S` (one pipeline of ``LRANGE``s and ``TIME``: the reference clock) and keeps, per slot,
the first time a fire message carrying it was seen. A message a worker took within one look of
its publishing is not seen: the share seen is reported with the figure, and beat is then on time.
"""

from __future__ import annotations

import json
import threading
from base64 import b64decode
from datetime import datetime

from redis import Redis

from celeryapp import app
from celeryapp.domain.names import CONTROL_QUEUE
from celeryapp.scheduling.fire_messages import BATCH_FIRE_TASK

LOOK_S = 0.02
#: The newest messages looked at in each priority list: more than beat sends between two looks.
NEWEST = 50


class FireWatch:
    def __init__(self, redis_url: str) -> None:
        self._client = Redis.from_url(redis_url)
        with app.connection_for_write() as conn:
            channel = conn.default_channel
            self._lists = [channel._q_for_pri(CONTROL_QUEUE, p) for p in channel.priority_steps]
        self._seen_ids: set[str] = set()
        #: (schedule name, slot's epoch seconds) → when its fire was first seen (epoch seconds).
        self.seen: dict[tuple[str, float], float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="fire-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _watch(self) -> None:
        while not self._stop.wait(LOOK_S):
            with self._client.pipeline(transaction=False) as pipe:
                pipe.time()
                for name in self._lists:
                    pipe.lrange(name, 0, NEWEST - 1)
                (seconds, micros), *lists = pipe.execute()
            for raw in (raw for messages in lists for raw in messages):
                self._note(json.loads(raw), seconds + micros / 1e6)

    def _note(self, message: dict[str, object], at: float) -> None:
        headers = message["headers"]
        assert isinstance(headers, dict)
        if headers.get("task") != BATCH_FIRE_TASK or headers["id"] in self._seen_ids:
            return
        self._seen_ids.add(headers["id"])
        body = message["body"]
        assert isinstance(body, str)
        for fire in json.loads(b64decode(body))[1]["fires"]:
            slot = datetime.fromisoformat(fire["nominal_at"]).timestamp()
            self.seen.setdefault((fire["name"], slot), at)

    def lateness_ms(self, start: float, end: float) -> list[float]:
        """Beat's lateness of each slot due in [start, end) whose fire was seen (ms)."""
        return [(at - slot) * 1000 for (_, slot), at in self.seen.items() if start <= slot < end]
