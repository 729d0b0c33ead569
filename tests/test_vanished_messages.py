"""A step message popped by a worker that never got the answer leaves no trace in the broker."""

from __future__ import annotations

from pathlib import Path

import pytest

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.domain.names import STEPS_QUEUE
from celeryapp.interfaces import service
from celeryapp.messaging import keys
from celeryapp.messaging.redis_client import get_redis
from celeryapp.recovery import recovery
from tests.support import processes
from tests.support.helpers import step, wait_for

pytestmark = pytest.mark.slow


def test_a_step_message_popped_without_trace_is_sent_again(
    app: ChordbeatCelery, settings: Settings, tmp_path: Path
) -> None:
    """A worker cut off while its blocking read was answered (the pop done, the reply lost), then
    killed: the message is in no queue and not unacknowledged; only its dispatch marker said it was
    on its way, for the broker's 6 h visibility timeout (chaos across hosts, seed 100: a schedule
    with `buffer_one` held behind it for the rest of the plan)."""
    service.apply_schedule(app, {"name": "popped", "every": 3600, "steps": [step("s")]})
    execution_id = service.trigger_schedule(app, "popped")["execution_id"]
    broker = get_redis(settings.broker_url)

    def pop() -> bytes | str | None:
        for key in keys.queue_keys(STEPS_QUEUE):
            popped = broker.rpop(key)
            if popped:
                return popped  # type: ignore[no-any-return]
        return None

    assert wait_for(pop, 10, what="the step's message in its queue")
    with processes.step_worker(settings, tmp_path):

        def recovered() -> bool:
            recovery.recover(app)
            return service.get_execution(app, execution_id)["status"] != "in_progress"

        wait_for(recovered, 30, interval=0.5, what="recovery to send the step again")
    done = service.get_execution(app, execution_id)
    assert done["status"] == "completed", done
    assert [a["attempt"] for a in done["activities"]] == [1], "sent again, not a new attempt"
