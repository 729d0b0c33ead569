"""Queue layout: control and service calls never wait behind steps, and no step runs on their queues."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import update

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.domain.names import CONTROL_QUEUE, PUBLIC_QUEUE, STEPS_QUEUE
from celeryapp.domain.validation import parse_definition
from celeryapp.errors import DefinitionError
from models import ScheduleStep, transaction
from tests.support import processes
from tests.support.helpers import call, finished, running, step, wait_for

#: Seconds a control or service call may take while every step slot is busy.
CONTROL_ANSWER_S = 2.0


@pytest.mark.parametrize("queue", [CONTROL_QUEUE, PUBLIC_QUEUE])
def test_a_step_on_a_control_queue_is_refused_naming_the_field(queue: str) -> None:
    definition = {"name": "q", "every": 60, "steps": [step("a"), [step("b"), step("c", queue=queue)]]}
    with pytest.raises(DefinitionError) as refused:
        parse_definition(definition)
    assert str(refused.value).startswith("steps[1][1].queue: ")
    assert "control queue" in str(refused.value)
    assert parse_definition({**definition, "steps": [step("a", queue="reports")]}).groups[0][0].queue == "reports"


def timed_call(client: Celery, task: str, **kwargs: Any) -> tuple[Any, float]:
    started = time.monotonic()
    answer = call(client, task, **kwargs)
    return answer, time.monotonic() - started


@pytest.mark.slow
def test_control_and_service_calls_answer_while_every_step_slot_is_busy(
    app: ChordbeatCelery, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    with (
        processes.step_worker(settings, tmp_path, concurrency=1),
        processes.control_worker(settings, tmp_path),
    ):
        call(
            client,
            "chordbeat.apply_schedule",
            definition={"name": "busy", "every": 3600, "steps": [step("long", kwargs={"seconds": 60})]},
        )
        execution_id = call(client, "chordbeat.trigger_schedule", name="busy")["execution_id"]
        running(client, execution_id, "long")
        # The only step slot is taken for a minute; a worker serving both would answer after it.
        timings = []
        for _ in range(3):
            seen, elapsed = timed_call(client, "chordbeat.get_execution", execution_id=execution_id)
            assert seen["status"] == "in_progress"
            timings.append(elapsed)
        cancelled, cancel_s = timed_call(client, "chordbeat.cancel_execution", execution_id=execution_id)
        assert cancelled["status"] == "cancelled"
        timings.append(cancel_s)
        # The cancel flag stops the step: the slot frees well before the minute is over.
        wait_for(
            lambda: (
                call(client, "chordbeat.get_execution", execution_id=execution_id)["activities"][0]["status"]
                == "cancelled"
            ),
            20,
            interval=0.2,
            what="the running step to stop",
        )
    print(f"\nanswers while the step slot was busy: {', '.join(f'{t * 1000:.0f} ms' for t in timings)}")
    assert max(timings) < CONTROL_ANSWER_S, timings


@pytest.mark.slow
def test_a_step_message_on_a_control_queue_is_moved_to_the_steps_queue_and_completes_its_group(
    app: ChordbeatCelery, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    with (
        processes.step_worker(settings, tmp_path),
        processes.control_worker(settings, tmp_path) as control,
    ):
        definition = {"name": "moved", "every": 3600, "steps": [step("a"), step("b")]}
        call(client, "chordbeat.apply_schedule", definition=definition)
        # A definition stored before control queues were refused: its first step is routed to one.
        with transaction(settings.database_url) as session:
            session.execute(update(ScheduleStep).where(ScheduleStep.name == "a").values(queue=PUBLIC_QUEUE))
        execution_id = call(client, "chordbeat.trigger_schedule", name="moved")["execution_id"]
        done = finished(client, execution_id, timeout=60)
    assert done["status"] == "completed", done["error"]
    assert [(a["step"], a["status"]) for a in done["activities"]] == [("a", "complete"), ("b", "complete")]
    assert all(a["worker"].startswith("steps@") for a in done["activities"]), done["activities"]
    assert f"arrived on '{PUBLIC_QUEUE}': moved to '{STEPS_QUEUE}'" in control.output()
