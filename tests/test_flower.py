"""What Flower shows about steps, checked through Flower itself (its API and its task page), with a
real prefork worker sending events, real beat (recovery), and a real revoke(terminate=True)."""

from __future__ import annotations

import base64
import contextlib
import re
import time
from pathlib import Path
from typing import Any

import pytest
import requests
from celery import Celery
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from sqlalchemy import select, update

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.domain.limits import LOG_TAIL_LINES
from celeryapp.domain.names import PREFIX, PUBLIC_QUEUE, runner_task_id
from celeryapp.interfaces import service
from celeryapp.messaging.redis_client import get_redis
from celeryapp.worker import step_events
from models import ActivityStatus, AuditSource, ScheduleStep, WorkerTask, transaction
from tests.support import processes
from tests.support.chromium import chromium
from tests.support.flower import Flower, flower
from tests.support.helpers import call, finished, running, step, token_of_task, wait_for
from tests.support.step_log_tasks import RAISING_LINE

pytestmark = pytest.mark.slow


def _runner_id(app: ChordbeatCelery, execution_id: int, worker_task_id: int) -> str:
    """The Celery task id of the first attempt of a worker task."""
    return runner_task_id(execution_id, worker_task_id, 1, token_of_task(app, worker_task_id))


def worker_task(app: ChordbeatCelery, execution_id: int, step_name: str) -> WorkerTask:
    with transaction(app.settings.database_url) as session:
        task = session.scalar(
            select(WorkerTask).where(WorkerTask.execution_id == execution_id, WorkerTask.step_name == step_name)
        )
        assert task is not None
        return task


HOSTILE_STEP = "<img src=x onerror=alert(1)>"


#: Workers that obey an operator's revoke from the broker (Flower's Revoke and Terminate buttons).
OPERATORS_REVOKE = {"CHORDBEAT_REMOTE_CONTROL": "revoke"}
#: Flower's task-publishing, result-reading and worker-control API, turned on (flower.cfg).
FLOWER_CONTROL = {"CHORDBEAT_FLOWER_CONTROL": "on"}
#: A worker that can run tests/support/step_log_tasks.py's chatty failing step.
STEP_LOG_TASKS = {"CHORDBEAT_TASK_MODULES": "tests.support.step_log_tasks", "PYTHONPATH": processes.ROOT}


def events_worker(
    settings: Settings, tmp: Path, env: dict[str, str] | None = None
) -> contextlib.AbstractContextManager[processes.Process]:
    """A prefork worker sending task events from the start (Flower would switch them on within 5 s)."""
    argv = [*processes.worker_argv("w1", 2), "-E"]
    return processes.running(processes.Process(argv, processes.settings_env(settings, **(env or {})), tmp / "w1.log"))


def watched(monitor: Flower, client: Celery, definition: dict[str, Any]) -> None:
    """Apply ``definition`` once Flower receives the worker's events (it does once a task shows up)."""
    flower_sees(
        monitor,
        lambda tasks: (
            call(client, "chordbeat.apply_schedule", definition=definition)
            and "chordbeat.apply_schedule" in by_name(tasks)
        ),
        "Flower to receive the worker's events",
    )


def flower_sees(monitor: Flower, predicate: Any, what: str, timeout: float = 60) -> dict[str, dict[str, Any]]:
    def check() -> dict[str, dict[str, Any]] | None:
        tasks = monitor.tasks()
        return tasks if predicate(tasks) else None

    found = wait_for(check, timeout, interval=0.5, what=what)
    assert isinstance(found, dict)
    return found


def steps_of(tasks: dict[str, dict[str, Any]], execution_id: int) -> dict[str, dict[str, Any]]:
    """The steps of one execution Flower lists (the ones it knows by name and arguments)."""
    return {u: t for u, t in tasks.items() if u.startswith(f"chordbeat-e{execution_id}-") and t.get("args")}


def by_name(tasks: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {t["name"]: {**t, "uuid": uuid} for uuid, t in tasks.items() if t.get("name")}


def test_flower_shows_steps_by_name_with_their_real_outcome_and_no_housekeeping(
    app: ChordbeatCelery, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    definition = {
        "name": "flower-truth",
        "every": 3600,
        "steps": [
            [
                step("ok"),
                step("bad", "chordbeat.examples.fail", continue_on_failure=True),
                step(HOSTILE_STEP, "chordbeat.examples.warn"),
            ],
            step("after"),
        ],
    }
    with flower(settings, tmp_path) as monitor, events_worker(settings, tmp_path), processes.beat(settings, tmp_path):
        watched(monitor, client, definition)
        execution_id = call(client, "chordbeat.trigger_schedule", name="flower-truth")["execution_id"]
        done = finished(client, execution_id, timeout=60)
        names = [f"flower-truth/{n}" for n in ("ok", "bad", HOSTILE_STEP, "after")]
        seen = flower_sees(
            monitor,
            lambda tasks: (
                all(by_name(tasks).get(n, {}).get("state") in {"SUCCESS", "FAILURE"} for n in names)
                and by_name(tasks)[names[3]].get("parent_id") in tasks
            ),
            "the four steps' final states in Flower, and the last one's parent",
        )
        # Recovery ran every second meanwhile, and get_execution was polled: none of it is listed.
        listed = by_name(seen)
        task_page = monitor.get(f"/task/{listed[names[2]]['uuid']}").text
        after_page = monitor.get(f"/task/{listed[names[3]]['uuid']}").text
        # Run now from the dashboard: the service in the web's process, no task starts the run.
        web_run = service.trigger_schedule(app, "flower-truth", actor="admin", source=AuditSource.WEB)["execution_id"]
        finished(client, web_run, timeout=60)
        of_web_run = flower_sees(
            monitor,
            lambda tasks: (
                len(steps_of(tasks, web_run)) == 4
                and all(
                    t.get("parent_id") in tasks for t in steps_of(tasks, web_run).values() if "group=2" in t["args"]
                )
            ),
            "the dashboard's run's steps in Flower, and group 2's parent",
        )
        # Flower's search (its UI's search box) lists one execution's steps, or one step's runs.
        of_execution = by_name(monitor.tasks(search=f"args:execution={execution_id}"))
        one_step = by_name(monitor.tasks(search="name:flower-truth/bad"))
    assert set(of_execution) == set(names)
    assert set(one_step) == {"flower-truth/bad"}
    # The group's failure did not stop advancement (continue_on_failure): the body ran.
    assert done["status"] == "completed", done
    ok, bad, warned, after = (listed[n] for n in names)
    assert ok["state"] == "SUCCESS" and ok["result"] == "complete"
    assert bad["state"] == "FAILURE", bad
    assert bad["exception"] == "failed_with_error: StepFailed: bad says so"
    assert warned["state"] == "SUCCESS"
    assert warned["result"] == f"complete_with_warning: {HOSTILE_STEP} says so"
    assert after["state"] == "SUCCESS"
    for task in (ok, bad, warned):
        assert task["args"] == f"(execution={execution_id}, group=1, attempt=1)"
        assert task["uuid"].startswith(f"chordbeat-e{execution_id}-")
    assert after["args"] == f"(execution={execution_id}, group=2, attempt=1)"
    assert "chordbeat.advance_execution" in listed  # what changes state is still shown
    # Each step's Parent: group 1's the task that started the run; group 2's the advancement of
    # group 1, not whichever step of group 1 finished last (it sends group 2).
    started = listed["chordbeat.trigger_schedule"]["uuid"]
    assert [t["parent_id"] for t in (ok, bad, warned)] == [started] * 3
    parent = seen[after["parent_id"]]
    assert (parent["name"], parent["args"]) == ("chordbeat.advance_execution", f"[{execution_id}, 0]")
    assert {t["root_id"] for t in (ok, bad, warned, after)} == {started}
    # A run with no starting task: group 1 has no parent (Flower shows none), group 2's is again
    # the advancement of group 1, which stands in as its root.
    web_steps = steps_of(of_web_run, web_run)
    assert [t.get("parent_id") for t in web_steps.values() if "group=1" in t["args"]] == [None] * 3
    (web_after,) = (t for t in web_steps.values() if "group=2" in t["args"])
    assert of_web_run[web_after["parent_id"]]["name"] == "chordbeat.advance_execution"
    assert web_after["root_id"] == web_after["parent_id"]
    shown_parent = re.search(r"<dt>Parent[^<]*</dt>\s*<dd>\s*<a href=\"/task/([^\"]+)\"", after_page)
    assert shown_parent and shown_parent.group(1) == after["parent_id"], after_page
    for quiet in ("chordbeat.recover", "chordbeat.reconcile_beat", "chordbeat.get_execution"):
        assert quiet not in listed, quiet
    # Flower's own page escapes the user-chosen step name.
    assert "&lt;img src=x onerror=alert(1)&gt;" in task_page
    assert HOSTILE_STEP not in task_page


@pytest.mark.timeout(120)
def test_terminate_from_flower_cancels_the_step_for_good_and_the_run_goes_on(
    app: ChordbeatCelery, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    definition = {
        "name": "terminate-me",
        "every": 3600,
        "steps": [step("long", kwargs={"seconds": 60}, continue_on_failure=True), step("after")],
    }
    # Workers obey Flower's Revoke and Terminate only when the operator turns revoke on, and Flower
    # offers them only when its control API is turned on too.
    with (
        flower(settings, tmp_path, **FLOWER_CONTROL) as monitor,
        events_worker(settings, tmp_path, OPERATORS_REVOKE),
        processes.beat(settings, tmp_path),
    ):
        call(client, "chordbeat.apply_schedule", definition=definition)
        execution_id = call(client, "chordbeat.trigger_schedule", name="terminate-me")["execution_id"]
        running(client, execution_id, "long")
        task_id = _runner_id(app, execution_id, worker_task(app, execution_id, "long").id)
        # What Flower's Terminate button sends (the same broadcast, through Flower's API).
        response = requests.post(
            f"{monitor.url}/api/task/revoke/{task_id}", data={"terminate": "true"}, auth=monitor.auth, timeout=10
        )
        assert response.ok, response.text
        done = finished(client, execution_id, timeout=30)
        shown = flower_sees(
            monitor, lambda tasks: tasks.get(task_id, {}).get("state") == "REVOKED", "Flower to show the step revoked"
        )[task_id]
        # Recovery (every 1 s, heartbeat TTL 3 s) had time to re-queue a lost attempt: it did not.
        time.sleep(3 * settings.heartbeat_ttl_s)
        again = call(client, "chordbeat.get_execution", execution_id=execution_id)
    assert done["status"] == "completed", done
    long_runs = [a for a in again["activities"] if a["step"] == "long"]
    assert [(a["attempt"], a["status"], a["error"]) for a in long_runs] == [
        (1, ActivityStatus.CANCELLED.value, step_events.TERMINATED)
    ]
    assert [a["status"] for a in again["activities"] if a["step"] == "after"] == ["complete"]
    assert shown["name"] == "terminate-me/long" and shown["exception"] == "cancelled: terminated by operator"


@pytest.mark.timeout(120)
def test_revoking_a_queued_step_cancels_it_and_the_group_still_advances(
    app: ChordbeatCelery, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    definition = {
        "name": "revoke-me",
        "every": 3600,
        "steps": [
            [step("blocker", kwargs={"seconds": 4}), step("target", continue_on_failure=True)],
            step("after"),
        ],
    }
    # One step process: while the blocker runs, the target's message waits (on the worker or queued).
    with (
        processes.step_worker(settings, tmp_path, concurrency=1, env=OPERATORS_REVOKE),
        processes.control_worker(settings, tmp_path),
        processes.beat(settings, tmp_path),
    ):
        call(client, "chordbeat.apply_schedule", definition=definition)
        execution_id = call(client, "chordbeat.trigger_schedule", name="revoke-me")["execution_id"]
        running(client, execution_id, "blocker")
        task = worker_task(app, execution_id, "target")
        # What Flower's Revoke button sends.
        client.control.revoke(_runner_id(app, execution_id, task.id))
        done = finished(client, execution_id, timeout=60)
    assert done["status"] == "completed", done
    outcomes = {a["step"]: (a["attempt"], a["status"], a["error"]) for a in done["activities"]}
    assert outcomes["target"] == (1, ActivityStatus.CANCELLED.value, step_events.REVOKED)
    assert outcomes["after"][1] == "complete"


@pytest.mark.parametrize(
    ("returned", "event", "fields"),
    [
        (
            "{'status': 'failed_with_error', 'error': 'StepFailed: boom'}",
            "task-failed",
            {"exception": "failed_with_error: StepFailed: boom", "traceback": ""},
        ),
        (
            "{'status': 'cancelled', 'error': 'terminated by operator'}",
            "task-revoked",
            {"exception": "cancelled: terminated by operator", "terminated": True, "expired": False, "signum": None},
        ),
        (
            "{'status': 'complete_with_warning', 'warning': 'disk 91%'}",
            "task-succeeded",
            {"result": "complete_with_warning: disk 91%"},
        ),
        ("{'status': 'complete'}", "task-succeeded", {"result": "complete"}),
        (
            "{'status': 'skipped'}",
            "task-succeeded",
            {"result": "skipped: nothing ran (duplicate, fenced or not claimable message)"},
        ),
        # Not the runner's shape (cut short, or another value): passed on as it came.
        ("{'status': 'failed_with_e", "task-succeeded", {"result": "{'status': 'failed_with_e"}),
        ("__import__('os')", "task-succeeded", {"result": "__import__('os')"}),
    ],
)
def test_the_event_sent_for_a_runner_tells_its_steps_outcome(returned: str, event: str, fields: dict[str, Any]) -> None:
    assert step_events.event_for(returned) == (event, fields)


@pytest.mark.parametrize("answer", list(step_events.RunnerAnswer))
def test_a_runners_answer_is_plain_text_in_its_repr_and_read_back(answer: step_events.RunnerAnswer) -> None:
    returned = repr(answer.result())
    assert returned == f"{{'status': '{answer.value}'}}"
    _, fields = step_events.event_for(returned)
    assert fields.get("result", fields.get("exception", "")).startswith(answer.value) or (
        answer is step_events.RunnerAnswer.FENCED
    )
    if answer is step_events.RunnerAnswer.FENCED:
        # Stopped, not a success: recovery gave the attempt up and nothing else was recorded.
        assert fields["exception"] == f"cancelled: {step_events.FENCED_TEXT}"
        return
    nothing_ran = answer not in (step_events.RunnerAnswer.LEASE_LOST, step_events.RunnerAnswer.UNRECORDED)
    assert ("nothing ran" in fields["result"]) is nothing_ran


def test_step_names_shown_to_monitors_are_bounded() -> None:
    long = "x" * 300
    name = step_events.shadow_name(long, "extract")
    assert name.endswith("…/extract") and len(name) == step_events.NAME_PART_CHARS + len("/extract")
    assert step_events.args_repr(41, 0, 2) == "(execution=41, group=1, attempt=2)"


def test_a_cancel_of_queued_steps_is_not_taken_for_an_operators_revoke(
    app: ChordbeatCelery, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    # Three parallel steps on one step process: two wait (on the worker or in the queue) when the
    # run is cancelled; they run, and their claim finds the run over.
    steps = [[step(f"s{i}", kwargs={"seconds": 30}) for i in range(3)]]
    with (
        processes.step_worker(settings, tmp_path, concurrency=1) as steps_worker,
        processes.control_worker(settings, tmp_path),
    ):
        call(client, "chordbeat.apply_schedule", definition={"name": "cancelled", "every": 3600, "steps": steps})
        execution_id = call(client, "chordbeat.trigger_schedule", name="cancelled")["execution_id"]
        running(client, execution_id, "s0")
        tasks = [worker_task(app, execution_id, f"s{i}") for i in range(3)]
        task_ids = [_runner_id(app, execution_id, t.id) for t in tasks]  # read before the cancel deletes them
        assert call(client, "chordbeat.cancel_execution", execution_id=execution_id)["status"] == "cancelled"

        # Every runner ends, the queued ones included: they ran (and skipped), so the chord did not
        # fail (a dropped message would be a REVOKED chord part). Celery's line for the running
        # one says its step was cancelled (worker/trace_log.py), the others' that they succeeded.
        def ended(task_id: str) -> bool:
            log = steps_worker.output()
            return f"[{task_id}] succeeded" in log or f"[{task_id}] ran in" in log

        wait_for(lambda: all(ended(t) for t in task_ids), 30, what="every runner to end")
        assert re.search(rf"\[{re.escape(task_ids[0])}\] ran in \S+s: its step was CANCELLED", steps_worker.output())
        final = call(client, "chordbeat.get_execution", execution_id=execution_id)
    assert not get_redis(app.settings.broker_url).keys(f"{PREFIX}:stop:*")
    assert {a["error"] for a in final["activities"]} == {final["error"]}


def test_a_step_cancelled_from_the_dashboard_while_it_ran_is_revoked_with_the_stored_reason(
    app: ChordbeatCelery, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    definition = {"name": "cancel-me", "every": 3600, "steps": [step("long", kwargs={"seconds": 60})]}
    with flower(settings, tmp_path) as monitor, events_worker(settings, tmp_path):
        watched(monitor, client, definition)
        execution_id = call(client, "chordbeat.trigger_schedule", name="cancel-me")["execution_id"]
        running(client, execution_id, "long")
        task_id = _runner_id(app, execution_id, worker_task(app, execution_id, "long").id)
        time.sleep(3)  # the scenario: the step had run for 3 s when it was cancelled
        # What the dashboard's Cancel does: the service, in its process, as the web's user.
        service.cancel_execution(app, execution_id, actor="admin", reason="wrong payload", source=AuditSource.WEB)
        shown = flower_sees(
            monitor,
            lambda tasks: tasks.get(task_id, {}).get("state") not in (None, "RECEIVED", "STARTED"),
            "Flower to show the step's end",
        )[task_id]
        stored = call(client, "chordbeat.get_execution", execution_id=execution_id)
    (activity,) = stored["activities"]
    assert (activity["status"], activity["error"]) == ("cancelled", stored["error"])
    assert "admin" in stored["error"] and "wrong payload" in stored["error"]
    # Before: SUCCESS, "fenced: nothing ran (duplicate, fenced or not claimable message)".
    assert shown["state"] == "REVOKED", shown
    assert shown["exception"] == f"cancelled: {stored['error']}"


def test_a_failed_step_shows_its_traceback_and_keeps_it_with_its_last_log_lines(
    app: ChordbeatCelery, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    upload = {"name": "Upload to bank", "task": "steplog.chatty_fail", "kwargs": {"lines": 200}}
    definition = {"name": "payroll-export", "every": 3600, "steps": [upload]}
    with flower(settings, tmp_path) as monitor, events_worker(settings, tmp_path, STEP_LOG_TASKS):
        watched(monitor, client, definition)
        execution_id = call(client, "chordbeat.trigger_schedule", name="payroll-export")["execution_id"]
        done = finished(client, execution_id, timeout=60)
        seen = flower_sees(
            monitor,
            lambda tasks: by_name(tasks).get("payroll-export/Upload to bank", {}).get("state") == "FAILURE",
            "Flower to show the failed step",
        )
        task_id = by_name(seen)["payroll-export/Upload to bank"]["uuid"]
        info = monitor.get(f"/api/task/info/{task_id}").json()
        # A name with spaces, searched as docs/flower.md says: in quotes.
        named = monitor.tasks(search='name:"payroll-export/Upload to bank"')
    assert set(named) == {task_id}
    # Flower's Traceback box: the real traceback, to the raising line, the password hidden.
    assert info["state"] == "FAILURE"
    assert info["traceback"].startswith("Traceback (most recent call last):")
    assert RAISING_LINE in info["traceback"] and "hunter2" not in info["traceback"]
    assert (
        info["traceback"]
        .rstrip()
        .endswith("ConnectionError: bank refused postgresql://bank:<hidden>@bank.example/upload")
    )
    # The activity keeps the same traceback and the last 50 of the 201 lines the step logged and printed.
    (activity,) = done["activities"]
    assert activity["status"] == "failed_with_error"
    assert activity["error"] == "ConnectionError: bank refused postgresql://bank:<hidden>@bank.example/upload"
    assert activity["traceback"] == info["traceback"]
    lines = activity["log_tail"].splitlines()
    assert len(lines) == LOG_TAIL_LINES
    assert lines[0].endswith("INFO hr.bank: uploading record 151") and lines[-2].endswith("uploading record 199")
    assert lines[-1].endswith("giving up on the bank")


def test_kwargs_search_lists_exactly_one_executions_steps(
    app: ChordbeatCelery, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    definition = {"name": "exact", "every": 3600, "steps": [[step("a"), step("b")]]}
    with flower(settings, tmp_path) as monitor, events_worker(settings, tmp_path):
        watched(monitor, client, definition)
        first = call(client, "chordbeat.trigger_schedule", name="exact")["execution_id"]
        finished(client, first)
        last = first
        while last < first * 10:  # run first*10 exists: its id starts with the first's digits
            last = call(client, "chordbeat.trigger_schedule", name="exact")["execution_id"]
            finished(client, last)
        flower_sees(
            monitor,
            lambda tasks: (
                sum(t.get("state") == "SUCCESS" and t.get("name", "").startswith("exact/") for t in tasks.values())
                == 2 * (last - first + 1)
            ),
            "every run's steps in Flower",
        )
        exact = monitor.tasks(search=f"kwargs:execution={first}")
        substring = monitor.tasks(search=f"args:execution={first}")
    assert {t["name"] for t in exact.values()} == {"exact/a", "exact/b"}
    assert all(uuid.startswith(f"chordbeat-e{first}-") for uuid in exact)
    # Why the docs give kwargs: a substring of the args also finds run first*10's steps.
    assert any(uuid.startswith(f"chordbeat-e{first * 10}-") for uuid in substring)


def search_box(browser: WebDriver, monitor: Flower, query: str) -> tuple[list[str], str]:
    """Type ``query`` into Flower's /tasks search box as a person does; the rows' names, and the
    search error Flower shows (empty if none)."""
    browser.get(monitor.url + "/tasks")
    box = wait_for(lambda: browser.find_element(By.CSS_SELECTOR, "input[type=search]"), 20, what="the search box")
    assert isinstance(box, WebElement)
    box.clear()
    box.send_keys(query)

    def shown() -> tuple[list[str], str] | None:
        # The table searches as the person types (after a pause): wait for the answer to the
        # whole query, the last one it asked for.
        answered = browser.execute_script(
            "var s = $('#tasks-table').DataTable().settings()[0];"
            "return s.oPreviousSearch.sSearch === arguments[0] && !!s.json && s.json.draw === s.iDraw;",
            query,
        )
        if not answered:
            return None
        error = browser.find_element(By.ID, "task-search-error-message").text
        cells = browser.find_elements(By.CSS_SELECTOR, "#tasks-table tbody td")
        return [c.text for c in cells if "/" in c.text and not c.text.startswith("chordbeat-")], error

    found = wait_for(shown, 20, interval=0.3, what=f"Flower's answer to {query!r}")
    assert isinstance(found, tuple)
    return found


@pytest.mark.timeout(120)
def test_a_step_received_while_task_events_were_off_is_still_found_as_the_docs_say(
    app: ChordbeatCelery, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    """The operator's 'args:execution=5 returns nothing': a worker sends no task-received (the only
    event naming the task and its arguments) while its events are off, as after it (re)started in
    the 5 s before Flower switches them on. Flower then lists the step without name or arguments,
    and no search finds it. The step's final event now names it too."""
    definition = {"name": "late", "every": 3600, "steps": [step("Upload to bank", kwargs={"seconds": 3})]}
    # Flower not switching events on by itself, so that the test decides when they are.
    with (
        flower(settings, tmp_path, FLOWER_ENABLE_EVENTS="false") as monitor,
        processes.worker(settings, tmp_path),
        chromium() as browser,
    ):
        call(client, "chordbeat.apply_schedule", definition=definition)
        execution_id = call(client, "chordbeat.trigger_schedule", name="late")["execution_id"]
        running(client, execution_id, "Upload to bank")  # received, with events off
        task_id = _runner_id(app, execution_id, worker_task(app, execution_id, "Upload to bank").id)
        client.control.enable_events()  # what Flower does every 5 s
        finished(client, execution_id, timeout=30)
        shown = flower_sees(
            monitor, lambda tasks: tasks.get(task_id, {}).get("state") == "SUCCESS", "Flower to see the step end"
        )[task_id]
        by_execution = monitor.tasks(search=f"kwargs:execution={execution_id}")
        browser.execute_cdp_cmd("Network.enable", {})
        token = base64.b64encode(":".join(monitor.auth).encode()).decode()
        browser.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Basic {token}"}})
        typed = {
            query: search_box(browser, monitor, query)
            for query in (
                f"kwargs:execution={execution_id}",
                f"args:execution={execution_id}",
                'name:"late/Upload to bank"',
                "name:late/Upload to bank",
            )
        }
    assert shown["name"] == "late/Upload to bank"
    assert shown["args"] == f"(execution={execution_id}, group=1, attempt=1)"
    assert set(by_execution) == {task_id}
    assert typed[f"kwargs:execution={execution_id}"] == (["late/Upload to bank"], "")
    assert typed[f"args:execution={execution_id}"] == (["late/Upload to bank"], "")
    assert typed['name:"late/Upload to bank"'] == (["late/Upload to bank"], "")
    # Unquoted, Flower splits the name at its spaces and refuses "to": why the docs quote it.
    rows, error = typed["name:late/Upload to bank"]
    assert rows == [] and "at least 3 characters" in error


@pytest.mark.timeout(120)
def test_a_step_moved_off_a_control_queue_keeps_its_name_and_arguments_in_flower(
    app: ChordbeatCelery, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    definition = {"name": "moved", "every": 3600, "steps": [step("a")]}
    with (
        flower(settings, tmp_path) as monitor,
        processes.step_worker(settings, tmp_path),
        processes.control_worker(settings, tmp_path),
    ):
        watched(monitor, client, definition)
        # A definition stored before control queues were refused: its step is routed to one, and
        # the control worker moves the message to the steps queue (tasks/steps.py).
        with transaction(settings.database_url) as session:
            session.execute(update(ScheduleStep).where(ScheduleStep.name == "a").values(queue=PUBLIC_QUEUE))
        execution_id = call(client, "chordbeat.trigger_schedule", name="moved")["execution_id"]
        finished(client, execution_id, timeout=60)
        seen = flower_sees(
            monitor, lambda tasks: by_name(tasks).get("moved/a", {}).get("state") == "SUCCESS", "the moved step's end"
        )
        found = monitor.tasks(search=f"kwargs:execution={execution_id}")
    shown = by_name(seen)["moved/a"]
    assert shown["args"] == f"(execution={execution_id}, group=1, attempt=1)"
    assert set(found) == {shown["uuid"]}


#: Flower's routes that queue a task, read a stored result, or change a task or a worker: what a
#: Flower login could do as a broker caller and a worker operator.
CONTROL_ROUTES = (
    ("POST", "/api/task/async-apply/chordbeat.apply_schedule"),
    ("POST", "/api/task/send-task/chordbeat.apply_schedule"),
    ("POST", "/api/task/apply/chordbeat.apply_schedule"),
    ("GET", "/api/task/result/{task}"),
    ("POST", "/api/task/abort/{task}"),
    ("POST", "/api/task/revoke/{task}"),
    ("POST", "/api/task/timeout/chordbeat.run_step"),
    ("POST", "/api/task/rate-limit/chordbeat.run_step"),
    ("POST", "/api/worker/shutdown/{worker}"),
    ("POST", "/api/worker/pool/restart/{worker}"),
    ("POST", "/api/worker/pool/grow/{worker}"),
    ("POST", "/api/worker/pool/shrink/{worker}"),
    ("POST", "/api/worker/pool/autoscale/{worker}"),
    ("POST", "/api/worker/queue/add-consumer/{worker}"),
    ("POST", "/api/worker/queue/cancel-consumer/{worker}"),
)
#: What a Flower login reads: the pages, the task list and details, the workers.
READ_ROUTES = (
    "/",
    "/workers",
    "/worker/{worker}",
    "/tasks",
    "/task/{task}",
    "/api/tasks",
    "/api/task/info/{task}",
    "/api/task/types",
    "/api/workers",
    "/api/queues/length",
    "/broker",
)


def test_flower_is_read_only_unless_its_control_api_is_turned_on(
    client: Celery, settings: Settings, tmp_path: Path
) -> None:
    definition = {"name": "watched", "every": 3600, "steps": [step("a")]}
    with flower(settings, tmp_path) as monitor, events_worker(settings, tmp_path) as worker:
        watched(monitor, client, definition)
        task = by_name(monitor.tasks())["chordbeat.apply_schedule"]["uuid"]
        workers = wait_for(lambda: list(monitor.get("/api/workers", refresh="1").json()), 30, what="the worker")
        names = {"task": task, "worker": workers[0]}
        hostile = {"kwargs": {"definition": {**definition, "name": "from-flower"}}, "command": "x"}
        answers = {
            route: requests.request(
                method, monitor.url + route.format(**names), json=hostile, auth=monitor.auth, timeout=10
            ).status_code
            for method, route in CONTROL_ROUTES
        }
        assert answers == {route: 403 for _, route in CONTROL_ROUTES}
        for route in READ_ROUTES:
            response = monitor.get(route.format(**names))
            assert response.status_code == 200, (route, response.text[:300])
        assert worker.running
        # Queued after Flower's would-be calls on the same queue: any of them would be applied by now.
        assert [s["name"] for s in call(client, "chordbeat.list_schedules")] == ["watched"]
