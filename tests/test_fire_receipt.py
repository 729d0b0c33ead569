"""A fire message counts as taken when a worker receives it, not when it runs it."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import pytest
from celery import Celery

from celeryapp.config import Settings
from celeryapp.domain.names import CONTROL_QUEUE
from celeryapp.messaging.keys import queued_fire_key
from celeryapp.messaging.redis_client import get_redis
from tests.support import processes
from tests.support.chaos import pool_processes
from tests.support.helpers import wait_for

pytestmark = pytest.mark.slow


@pytest.mark.timeout(120)
def test_a_fire_message_received_by_a_worker_killed_before_running_it_holds_nothing_back(
    client: Celery, settings: Settings, tmp_path: Path
) -> None:
    """Found by the limits' chaos plan (seed 3901, PostgreSQL): a worker SIGKILLed just after it
    received a fire left the fire's queued marker behind, its message unacked for the broker's
    visibility timeout, and beat fired that schedule no more (every second: the lost-slot re-fire's
    fire was superseded by the next slot each time, which beat held)."""
    broker = get_redis(settings.broker_url)
    message_id = str(uuid.uuid4())
    with processes.worker(settings, tmp_path, "w1", concurrency=1) as w1:
        children = wait_for(lambda: list(pool_processes({w1.pid})), 30, what="the pool process")
        assert isinstance(children, list)
        (child,) = children
        # Its only pool process frozen: the worker receives the message and never runs it.
        os.kill(child, signal.SIGSTOP)
        broker.set(queued_fire_key(message_id), "1", ex=600)  # as beat marks its fires
        client.send_task("chordbeat.fire_batch", kwargs={"fires": []}, queue=CONTROL_QUEUE, task_id=message_id)
        wait_for(lambda: f"fire_batch[{message_id}] received" in w1.output(), 60, what="the fire received")
        wait_for(lambda: not broker.exists(queued_fire_key(message_id)), 5, what="its marker cleared on receipt")
        w1.kill()
    assert not broker.exists(queued_fire_key(message_id))
