"""Lists are summaries with cursors, and every answer has a size bound (issue 23).

``list_executions`` used to load every run's activities: a page of 200 runs of 100 steps answered
26 MB. A summary leaves out ``activities``, ``tasks`` and ``payload`` and counts the steps in SQL;
``get_execution`` still gives everything.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from kombu.utils.json import dumps
from sqlalchemy import event, update

from celeryapp.application import ChordbeatCelery
from celeryapp.client import ChordbeatClient, each_execution, each_schedule
from celeryapp.config import Settings
from celeryapp.domain.limits import (
    MAX_DEFINITION_BYTES,
    MAX_EXECUTION_LIST_LIMIT,
    MAX_JSON_BYTES,
    MAX_SCHEDULE_LIST_LIMIT,
)
from celeryapp.interfaces import service, summaries
from celeryapp.interfaces.alerts import silence_schedule
from celeryapp.interfaces.summaries import MAX_SCHEDULE_BYTES, MAX_SUMMARY_BYTES
from models import (
    Activity,
    ActivityStatus,
    ExecutionStatus,
    Schedule,
    ScheduleExecution,
    ScheduleStep,
    Trigger,
    transaction,
    utcnow,
)
from tests.support.helpers import call, finished, step

pytestmark = pytest.mark.both_databases

#: A step's warning text: 100 of them make a plan of about 210 KB (a definition holds 256 KB).
LONG_TEXT_CHARS = 2000
WIDE_STEPS = 100
SUMMARY_KEYS = {
    "id",
    "schedule",
    "status",
    "trigger",
    "run_key",
    "current_step_index",
    "started_at",
    "completed_at",
    "error",
    "rerun_of",
    "rerun_from_group",
    "slot",
    "version",
    "steps",
}


def wide_definition() -> dict[str, Any]:
    """One group of 100 parallel steps, each completing with a 2,000-character warning."""
    group = [
        step(f"w{i:03}", "chordbeat.examples.warn", kwargs={"message": f"{i:03}" + "w" * (LONG_TEXT_CHARS - 3)})
        for i in range(WIDE_STEPS)
    ]
    return {"name": "wide", "every": 3600, "overlap": "allow", "steps": [group]}


def test_a_full_page_is_bounded_in_size_and_get_execution_still_has_everything(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    """Before: each run of the page carried its 100 activities (about 125 KB each here)."""
    call(client, "chordbeat.apply_schedule", definition=wide_definition())
    stops = [step("boom", "chordbeat.examples.fail", kwargs={"message": "x" * LONG_TEXT_CHARS}), step("b"), step("c")]
    call(client, "chordbeat.apply_schedule", definition={"name": "stops", "every": 3600, "steps": stops})
    payload = {"blob": "p" * (MAX_JSON_BYTES - 100)}
    wide = [call(client, "chordbeat.trigger_schedule", name="wide", payload=payload)["execution_id"] for _ in range(3)]
    failed = call(client, "chordbeat.trigger_schedule", name="stops")["execution_id"]
    for execution_id in [*wide, failed]:
        finished(client, execution_id, timeout=120)

    listed = call(client, "chordbeat.list_executions", limit=MAX_EXECUTION_LIST_LIMIT)
    answer = dumps(listed)  # as the worker stores it for the caller (Celery's JSON)
    assert [e["id"] for e in listed] == [failed, *wide[::-1]]
    assert max(len(dumps(e)) for e in listed) <= MAX_SUMMARY_BYTES
    # The stated bound of any answer: at most limit summaries of at most MAX_SUMMARY_BYTES each.
    assert len(answer) <= len(listed) * (MAX_SUMMARY_BYTES + 2) <= MAX_EXECUTION_LIST_LIMIT * (MAX_SUMMARY_BYTES + 2)
    assert all(set(e) == SUMMARY_KEYS for e in listed), listed[0].keys()
    by_id = {e["id"]: e for e in listed}
    assert by_id[wide[0]]["steps"] == {"total": WIDE_STEPS, "complete_with_warning": WIDE_STEPS}
    # Steps never started count in the total only; the run's long error is cut in the list.
    assert by_id[failed]["steps"] == {"total": 3, "failed_with_error": 1}
    assert by_id[failed]["status"] == "failed" and len(by_id[failed]["error"]) <= 1000

    whole = call(client, "chordbeat.get_execution", execution_id=wide[0])
    assert whole["payload"] == payload and whole["tasks"] == []
    assert sorted(a["message"] for a in whole["activities"]) == sorted(
        s["kwargs"]["message"] for s in wide_definition()["steps"][0]
    )
    failure = call(client, "chordbeat.get_execution", execution_id=failed)
    assert "x" * 1500 in failure["activities"][0]["error"]
    assert failure["error"].startswith(by_id[failed]["error"].removesuffix("…"))


def test_the_cursor_pages_through_every_execution_once_while_runs_start(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings
) -> None:
    call(
        client,
        "chordbeat.apply_schedule",
        definition={"name": "a", "every": 3600, "overlap": "allow", "steps": [step("s")]},
    )
    call(
        client,
        "chordbeat.apply_schedule",
        definition={"name": "b", "every": 3600, "overlap": "allow", "steps": [step("s")]},
    )
    started = [call(client, "chordbeat.trigger_schedule", name="ab"[i % 2])["execution_id"] for i in range(11)]
    caller = ChordbeatClient(settings.broker_url, settings.result_backend)
    try:
        seen: list[int] = []
        meanwhile: list[int] = []
        before: int | None = None
        while True:
            page = caller.list_executions(limit=4, before_id=before)
            seen += [e["id"] for e in page]
            # New runs between pages are newer than the cursor: they neither shift nor repeat a page.
            meanwhile.append(caller.trigger_schedule("a")["execution_id"] or 0)
            if len(page) < 4:
                break
            before = page[-1]["id"]
        assert seen == sorted(started, reverse=True) and min(meanwhile) > max(started)

        everything = [e["id"] for e in each_execution(caller, page=3)]
        assert everything == sorted(started + meanwhile, reverse=True)
        only_b = [e["id"] for e in each_execution(caller, schedule="b", page=2)]
        assert only_b == [i for i in sorted(started, reverse=True) if started.index(i) % 2]
        assert caller.list_executions(before_id=min(started)) == []
    finally:
        caller.close()


def test_the_total_is_the_stored_step_count_or_for_older_runs_the_plan_counted(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    """The count is written with the run (revision 0007): a list reads no plan of up to 256 KB."""
    call(
        client,
        "chordbeat.apply_schedule",
        definition={"name": "three", "every": 60, "steps": [step("a"), [step("b"), step("c")]]},
    )
    execution_id = call(client, "chordbeat.trigger_schedule", name="three")["execution_id"]
    finished(client, execution_id)

    def total(step_count: int | None) -> int:
        with transaction(app.settings.database_url) as session:
            session.execute(update(ScheduleExecution).values(step_count=step_count))
        return int(call(client, "chordbeat.list_executions")[0]["steps"]["total"])

    assert total(3) == 3
    assert total(None) == 3  # a run started before the column existed: its plan is counted
    assert total(7) == 7  # the stored count is what is read, not the plan


def test_steps_are_counted_by_their_latest_attempt(app: ChordbeatCelery) -> None:
    """A step tried again counts once, as its newest attempt stands; one not started only in the total."""
    plan = [[{"name": n, "task": "t"} for n in ("a", "b")], [{"name": "c", "task": "t"}]]
    with transaction(app.settings.database_url) as session:
        run = ScheduleExecution(
            schedule_name="r", status=ExecutionStatus.IN_PROGRESS, trigger=Trigger.MANUAL, run_key="r:1", plan=plan
        )
        session.add(run)
        session.flush()
        for name, attempt, status in (
            ("a", 1, ActivityStatus.FAILED_WITH_ERROR),
            ("a", 2, ActivityStatus.COMPLETE),
            ("b", 1, ActivityStatus.FAILED_WITH_ERROR),
            ("b", 2, ActivityStatus.FAILED_WITH_ERROR),
            ("b", 3, ActivityStatus.IN_PROGRESS),
        ):
            session.add(Activity(execution_id=run.id, step_index=0, step_name=name, attempt=attempt, status=status))
    (summary,) = service.list_executions(app)
    assert summary["steps"] == {"total": 3, "complete": 1, "in_progress": 1}


def test_schedules_are_listed_a_page_at_a_time_by_name(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings
) -> None:
    names = [f"s{i:02}" for i in range(7)]
    for name in reversed(names):
        call(client, "chordbeat.apply_schedule", definition={"name": name, "every": 60, "steps": [step("x")]})
    pages = [
        [s["name"] for s in call(client, "chordbeat.list_schedules", limit=3, after_name=after)]
        for after in (None, "s02", "s05", "s06")
    ]
    assert pages == [names[:3], names[3:6], names[6:], []]
    assert [s["name"] for s in call(client, "chordbeat.list_schedules")] == names  # default limit 500
    caller = ChordbeatClient(settings.broker_url, settings.result_backend)
    try:
        assert [s["name"] for s in each_schedule(caller, page=2)] == names
        assert [s["name"] for s in caller.list_schedules(limit=2, after_name="s0")] == names[:2]
    finally:
        caller.close()


def test_a_schedules_page_is_bounded_by_the_definition_cap(app: ChordbeatCelery, worker: Any, client: Celery) -> None:
    """Schedule objects are whole (the contract): each is bounded by the definition cap, lengthened
    by Celery's separators (small integers are the worst case) and its last error."""
    groups = [[step(f"s{g}-{i}", kwargs={"n": [0] * 225}) for i in range(5)] for g in range(100)]
    call(client, "chordbeat.apply_schedule", definition={"name": "dense", "every": 60, "steps": groups})
    failing = [step("boom", "chordbeat.examples.fail", kwargs={"message": "\U0001f4a5" * 3000})]
    call(client, "chordbeat.apply_schedule", definition={"name": "erring", "every": 60, "steps": failing})
    finished(client, call(client, "chordbeat.trigger_schedule", name="erring")["execution_id"])

    listed = call(client, "chordbeat.list_schedules", limit=MAX_SCHEDULE_LIST_LIMIT)
    assert [s["name"] for s in listed] == ["dense", "erring"] and listed[1]["last_error"]
    sizes = [len(dumps(s)) for s in listed]
    assert sizes[0] > MAX_DEFINITION_BYTES  # lengthened by the separators, as the bound allows
    assert max(sizes) <= MAX_SCHEDULE_BYTES
    assert len(dumps(listed)) <= len(listed) * (MAX_SCHEDULE_BYTES + 2)


def test_a_schedules_page_stops_at_its_byte_bound_and_the_cursor_reads_on(
    app: ChordbeatCelery, worker: Any, client: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page of large definitions holds fewer than ``limit`` schedules: the answer stays under
    the page bound (one schedule at least), and following ``after_name`` to an empty page reads all."""
    big = [[step(f"s{g}-{i}", kwargs={"n": [0] * 200}) for i in range(5)] for g in range(20)]
    names = [f"big-{n}" for n in range(5)]
    for name in names:
        call(client, "chordbeat.apply_schedule", definition={"name": name, "every": 60, "steps": big})
    one = len(dumps(call(client, "chordbeat.get_schedule", name=names[0])))
    monkeypatch.setattr(summaries, "MAX_SCHEDULE_PAGE_BYTES", 2 * one + 100)

    seen: list[str] = []
    after = None
    while page := call(client, "chordbeat.list_schedules", limit=MAX_SCHEDULE_LIST_LIMIT, after_name=after):
        assert len(dumps(page)) <= summaries.MAX_SCHEDULE_PAGE_BYTES, len(dumps(page))
        assert len(page) == 2 or page[-1]["name"] == names[-1]
        seen += [s["name"] for s in page]
        after = page[-1]["name"]
    assert seen == names
    monkeypatch.setattr(summaries, "MAX_SCHEDULE_PAGE_BYTES", 1)
    assert [s["name"] for s in call(client, "chordbeat.list_schedules", limit=3)] == names[:1]


#: (task, kwargs, field, reason): what a broker caller can send instead of a number or a name.
HOSTILE = [
    *[
        ("list_executions", {"before_id": value}, "before_id", reason)
        for value, reason in (
            (True, "must be an integer (an execution id), got boolean"),
            ("5", "got string"),
            (5.0, "got float"),
            (math.nan, "got float"),
            ([5], "got list"),
            (0, "must be between 1 and 2147483647, got 0"),
            (-1, "got -1"),
            (2**31, "got 2147483648"),
            (10**30, "got 1000000000000000000000000000000"),
        )
    ],
    *[
        (task, {"limit": value}, "limit", f"must be an integer between 1 and {high}, got {got}")
        for task, high in (("list_executions", 500), ("list_schedules", 5000))
        for value, got in (
            (0, "0"),
            (-5, "-5"),
            (high + 1, str(high + 1)),
            (10**30, "1000000000000000000000000000000"),
            (True, "boolean"),
            ("50", "string"),
            (50.0, "float"),
            (math.inf, "float"),
            (math.nan, "float"),
            (None, "null"),
        )
    ],
    *[
        ("list_schedules", {"after_name": value}, "after_name", reason)
        for value, reason in (
            (5, "must be a schedule name (a string), got int"),
            (True, "got boolean"),
            (["s00"], "got list"),
            ({"name": "s00"}, "got object"),
            ("", "must be 1 to 200 characters, got 0"),
            ("s" * 201, "got 201"),
            ("s\x00", "must not hold NUL"),
            ("s\ud800", "lone surrogates"),
        )
    ],
]


def test_hostile_cursors_and_limits_are_refused_naming_the_field(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    for task, kwargs, field, reason in HOSTILE:
        with pytest.raises(Exception, match=f"^{field}: .*{re.escape(reason)}") as caught:
            call(client, f"chordbeat.{task}", **kwargs)
        assert type(caught.value).__name__ == "InvalidArgument", (task, kwargs)


def test_a_schedules_page_reads_rows_not_orm_objects_and_answers_as_get_schedule(app: ChordbeatCelery) -> None:
    # Building a page's 500 schedule objects with their steps (tied to each other, so only the
    # garbage collector frees them) was most of its time (docs/scaling.md); its rows say the same.
    definitions: list[dict[str, Any]] = [
        {"name": "a-plain", "every": 60, "steps": [step("x")]},
        {
            "name": "b-wide",
            "cron": "30 2 * * 1-5",
            "timezone": "Europe/Paris",
            "overlap": "allow",
            "max_retries": 2,
            "timeout": 600,
            "payload": {"k": [1, "two"]},
            "deadlines": {"finish_within": 300},
            "catchup": {"policy": "all", "window": 3600, "max_runs": 3},
            "steps": [
                step("first", timeout=30, max_attempts=5, queue="reports"),
                [step("left", args=[1, 2]), step("right", continue_on_failure=True)],
                step("last", kwargs={"seconds": 0}),
            ],
        },
        {"name": "c-paused", "every": 3600, "enabled": False, "steps": [step("y")]},
    ]
    for definition in definitions:
        service.apply_schedule(app, definition)
    service.pause_schedule(app, "a-plain", actor="ops", reason="checking")
    silence_schedule(app, "b-wide", (utcnow() + timedelta(days=1)).isoformat(), reason="maintenance")
    loaded: list[object] = []

    def count(target: object, _context: object) -> None:
        loaded.append(target)

    for model in (Schedule, ScheduleStep):
        event.listen(model, "load", count)
    try:
        listed = service.list_schedules(app)
    finally:
        for model in (Schedule, ScheduleStep):
            event.remove(model, "load", count)
    assert loaded == []
    expected = []
    for definition in definitions:
        one = service.get_schedule(app, definition["name"])
        del one["runs"]  # only get_schedule counts the runs
        expected.append(one)
    assert listed == expected
