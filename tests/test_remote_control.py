"""Celery's remote control, as a broker caller with a plain Celery client finds it: a worker answers
what monitors read and refuses, and logs, every command that would change it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.worker.control import Panel

from celeryapp.config import Settings
from celeryapp.errors import ConfigError
from celeryapp.messaging import remote_control
from celeryapp.variables import WORKER_CHANGING_COMMANDS
from tests.support import processes
from tests.support.helpers import call, finished, step, wait_for


def test_every_command_celery_knows_is_either_answered_or_refused() -> None:
    # A command a new Celery adds is refused (it is in neither set) until someone classifies it here.
    answered = remote_control.INSPECTION_COMMANDS | remote_control.MONITORING_COMMANDS
    assert set(Panel.data) == answered | WORKER_CHANGING_COMMANDS
    assert not answered & WORKER_CHANGING_COMMANDS
    assert not remote_control.allowed("shutdown", ())
    assert not remote_control.allowed(["ping"], ())
    assert remote_control.allowed("ping", ())
    assert remote_control.allowed("revoke", frozenset({"revoke"}))
    assert remote_control.allowed("shutdown", frozenset({"all"}))


def test_remote_control_setting_is_off_by_default_and_names_the_field() -> None:
    assert Settings.from_env({}).remote_control == frozenset()
    assert Settings.from_env({"CHORDBEAT_REMOTE_CONTROL": "revoke, shutdown"}).remote_control == {"revoke", "shutdown"}
    with pytest.raises(ConfigError, match=r"^CHORDBEAT_REMOTE_CONTROL: 'ping'"):
        Settings.from_env({"CHORDBEAT_REMOTE_CONTROL": "ping"})  # always answered: not a switch


def _answers(replies: list[dict[str, Any]] | None) -> list[Any]:
    return [answer for reply in replies or [] for answer in reply.values()]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.timeout(120)
def test_a_broker_caller_cannot_change_a_worker_but_monitors_still_read_it(
    client: Celery, settings: Settings, tmp_path: Path
) -> None:
    definition = {"name": "still-running", "every": 3600, "steps": [step("a")]}
    with processes.worker(settings, tmp_path) as worker:
        wait_for(lambda: client.control.ping(timeout=1), 60, what=f"the worker to answer\n{worker.output()}")
        refused = {
            "rate_limit": client.control.rate_limit("chordbeat.run_step", "1/h", reply=True, timeout=2),
            "time_limit": client.control.time_limit("chordbeat.run_step", soft=1, hard=2, reply=True, timeout=2),
            "add_consumer": client.control.add_consumer("chordbeat", reply=True, timeout=2),
            "cancel_consumer": client.control.cancel_consumer("chordbeat.control", reply=True, timeout=2),
            "revoke": client.control.revoke("chordbeat-e1-1-1", terminate=True, reply=True, timeout=2),
            "hello": client.control.broadcast(
                "hello", arguments={"from_node": "x@y", "revoked": ["z"]}, reply=True, timeout=2
            ),
        }
        # Before: the worker exited (a loop of this defeats a supervisor's restarts).
        client.control.shutdown()
        wait_for(lambda: "refused 'shutdown'" in worker.output(), 20, what="the shutdown's refusal in the log")
        assert worker.running, worker.output()
        # A worker starting beside it asks it ``hello`` (Celery's mingle, on in the deploy files):
        # refused, and the newcomer starts all the same.
        argv = [arg for arg in processes.worker_argv("w2", 1) if arg != "--without-mingle"]
        with processes.running(processes.Process(argv, processes.settings_env(settings), tmp_path / "w2.log")) as w2:
            wait_for(lambda: "mingle: sync complete" in w2.output(), 60, what=f"w2's mingle\n{w2.output()}")
            wait_for(lambda: len(client.control.ping(timeout=1)) == 2, 30, what="both workers to answer")
        # What Flower and chordbeat read still answers.
        inspector = client.control.inspect(timeout=2)
        stats, active, queues = inspector.stats(), inspector.active(), inspector.active_queues()
        # Service calls are still served (the control queue kept) and steps still run.
        call(client, "chordbeat.apply_schedule", definition=definition)
        execution_id = call(client, "chordbeat.trigger_schedule", name="still-running")["execution_id"]
        done = finished(client, execution_id)
        log = worker.output()
    for command, replies in refused.items():
        answers = _answers(replies)
        assert answers, command
        assert all("refused" in answer.get("error", "") for answer in answers), (command, answers)
        assert f"refused {command!r} from the broker" in log, command
    assert "caller's reply address" in log
    assert stats and active is not None and queues
    (consumed,) = queues.values()
    assert "chordbeat.control" in {queue["name"] for queue in consumed}
    assert done["status"] == "completed", done
