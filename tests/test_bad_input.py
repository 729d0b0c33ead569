"""Hostile input: definitions, service task arguments and schedule files that must be refused.

Every case asserts that the error names the field (or argument, or place in the file) and that
nothing was written: the database's row counts, the stored schedules and chordbeat's Redis keys
(RedBeat entries included) are the same before and after. Most cases call the code directly on
SQLite; the service arguments also go through the real worker from a plain Celery client, on
SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from kombu.exceptions import DecodeError
from sqlalchemy import func, select

from celeryapp.application import ChordbeatCelery
from celeryapp.client import answer
from celeryapp.domain.cadence import cadence_of
from celeryapp.domain.limits import MAX_JSON_BYTES
from celeryapp.errors import ChordbeatError, DefinitionError, FieldError, InvalidArgument
from celeryapp.interfaces import service
from celeryapp.scheduling.beat_entries import CadenceSchedule
from celeryapp.scheduling.schedule_file import apply_file
from models import Activity, Schedule, ScheduleExecution, ScheduleStep, SlotRecord, WorkerTask, transaction, utcnow
from tests.support.helpers import call, finished, set_field
from tests.support.servers import wait_for

pytestmark = pytest.mark.both_databases

SLEEP = "chordbeat.examples.sleep"
DAY = 24 * 3600
TABLES = (Schedule, ScheduleStep, ScheduleExecution, WorkerTask, Activity, SlotRecord)
SQLITE_ONLY = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


def base() -> dict[str, Any]:
    """A valid definition of the schedule every test stores first ("kept")."""
    return {
        "name": "kept",
        "every": 3600,
        "payload": {"initiator": "tests"},
        "steps": [
            {"name": "first", "task": SLEEP, "kwargs": {"seconds": 0.01}},
            [{"name": "left", "task": SLEEP, "kwargs": {"seconds": 0.01}}, {"name": "right", "task": SLEEP}],
        ],
    }


def change(path: str, value: Any) -> Callable[[], dict[str, Any]]:
    """The base definition with one field (``steps/1/0/name``) set, or removed for ``KeyError``."""

    def make() -> dict[str, Any]:
        return set_field(base(), path, value)

    return make


def cron(expression: Any) -> Callable[[], dict[str, Any]]:
    def make() -> dict[str, Any]:
        definition = base()
        del definition["every"]
        definition["cron"] = expression
        return definition

    return make


def steps(groups: int, per_group: int) -> Callable[[], dict[str, Any]]:
    def make() -> dict[str, Any]:
        definition = base()
        definition["steps"] = [[{"name": f"s{g}-{i}", "task": SLEEP} for i in range(per_group)] for g in range(groups)]
        return definition

    return make


def whole(value: Any) -> Callable[[], Any]:
    return lambda: value


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def state(app: ChordbeatCelery) -> dict[str, Any]:
    """Everything a refused call must leave as it was."""
    with transaction(app.settings.database_url, read_only=True) as session:
        rows = {t.__tablename__: session.scalar(select(func.count()).select_from(t)) for t in TABLES}
    with redis.Redis.from_url(app.settings.redbeat_url) as client:
        keys = {key: client.dump(key) for key in sorted(client.scan_iter("chordbeat:*"))}
    return {"rows": rows, "schedules": service.list_schedules(app), "redis": keys}


def settled(app: ChordbeatCelery, execution_id: int, client: Celery) -> dict[str, Any]:
    """``state`` once the run has finished and its steps' keys are gone: the worker's watching
    thread deletes a finished step's heartbeat and pickup lease at its next poll, not at once."""
    finished(client, execution_id)
    with redis.Redis.from_url(app.settings.broker_url) as keys:
        wait_for(
            lambda: not [*keys.scan_iter("chordbeat:hb:*"), *keys.scan_iter("chordbeat:pickup:*")],
            5,
            what="the finished steps' keys to be deleted",
        )
    return state(app)


@pytest.fixture
def stored(app: ChordbeatCelery) -> dict[str, Any]:
    """The "kept" schedule, stored with its RedBeat entry, and one execution (id 1)."""
    service.apply_schedule(app, base())
    started = service.trigger_schedule(app, "kept")
    assert started["execution_id"] == 1
    before = state(app)
    assert before["rows"]["schedules"] == 1 and any(b"schedule:kept" in k for k in before["redis"])
    return before


# --- definitions ------------------------------------------------------------------------------

DEFINITIONS = [
    # numbers: ranges, bools, NaN, infinities
    ("every-1e-7", change("every", 1e-7), "every", "between 1 and 31622400 seconds (366 days), got 1e-07"),
    ("every-0.001", change("every", 0.001), "every", "between 1 and"),
    ("every-0", change("every", 0), "every", "between 1 and"),
    ("every-negative", change("every", -60), "every", "between 1 and"),
    ("every-bool", change("every", True), "every", "must be a number of seconds, got boolean"),
    ("every-string", change("every", "60"), "every", "got string"),
    ("every-list", change("every", [60]), "every", "got list"),
    ("every-nan", change("every", math.nan), "every", "got NaN"),
    ("every-inf", change("every", math.inf), "every", "got inf"),
    ("every-minus-inf", change("every", -math.inf), "every", "got -inf"),
    ("every-huge-int", change("every", 10**30), "every", "between 1 and"),
    ("every-1e300", change("every", 1e300), "every", "between 1 and"),
    ("every-over-a-year", change("every", 366 * DAY + 1), "every", "between 1 and"),
    ("timeout-1e300", change("timeout", 1e300), "timeout", "between 0.1 and 604800 seconds (7 days)"),
    ("timeout-0", change("timeout", 0), "timeout", "between 0.1 and"),
    ("timeout-negative", change("timeout", -1), "timeout", "between 0.1 and"),
    ("timeout-bool", change("timeout", True), "timeout", "got boolean"),
    ("timeout-nan", change("timeout", math.nan), "timeout", "got NaN"),
    ("timeout-over-a-week", change("timeout", 7 * DAY + 1), "timeout", "between 0.1 and"),
    ("retry_delay-half-second", change("retry_delay", 0.5), "retry_delay", "between 1 and 604800"),
    ("retry_delay-1e300", change("retry_delay", 1e300), "retry_delay", "between 1 and"),
    ("retry_delay-bool", change("retry_delay", False), "retry_delay", "got boolean"),
    ("max_retries-negative", change("max_retries", -1), "max_retries", "between 0 and 1000"),
    ("max_retries-1001", change("max_retries", 1001), "max_retries", "between 0 and 1000"),
    ("max_retries-bool", change("max_retries", True), "max_retries", "must be an integer, got boolean"),
    ("max_retries-float", change("max_retries", 2.0), "max_retries", "must be an integer, got float"),
    ("max_retries-huge", change("max_retries", 10**30), "max_retries", "between 0 and 1000"),
    ("total_repeats-negative", change("total_repeats", -1), "total_repeats", "between 0 and 1000000000"),
    ("total_repeats-too-many", change("total_repeats", 10**9 + 1), "total_repeats", "between 0 and"),
    ("total_repeats-string", change("total_repeats", "5"), "total_repeats", "got string"),
    ("step-timeout-1e300", change("steps/0/timeout", 1e300), "steps[0].timeout", "between 0.1 and 604800"),
    ("step-timeout-tiny", change("steps/0/timeout", 0.01), "steps[0].timeout", "between 0.1 and"),
    ("step-timeout-nan", change("steps/0/timeout", math.nan), "steps[0].timeout", "got NaN"),
    ("step-timeout-bool", change("steps/1/1/timeout", True), "steps[1][1].timeout", "got boolean"),
    ("max_attempts-0", change("steps/0/max_attempts", 0), "steps[0].max_attempts", "between 1 and 100"),
    ("max_attempts-101", change("steps/0/max_attempts", 101), "steps[0].max_attempts", "between 1 and 100"),
    ("max_attempts-bool", change("steps/0/max_attempts", True), "steps[0].max_attempts", "got boolean"),
    ("max_attempts-float", change("steps/0/max_attempts", 3.5), "steps[0].max_attempts", "got float"),
    # cron
    ("cron-six-fields", cron("* * * * * *"), "cron", "expected 5 fields"),
    ("cron-never-fires", cron("0 0 30 2 *"), "cron", "never occurs in month"),
    ("cron-too-long", cron("0," * 100 + "0 * * * *"), "cron", "at most 200 characters, got 209"),
    ("cron-number", cron(5), "cron", "must be a string, got int"),
    ("cron-and-every", change("cron", "* * * * *"), "cron", "exactly one of 'cron' and 'every'"),
    ("neither-cron-nor-every", change("every", KeyError), "cron", "exactly one of 'cron' and 'every'"),
    # schedule names (matched whole: "$" also matches before a trailing newline)
    ("name-trailing-newline", change("name", "kept\n"), "name", "got 'kept\\n'"),
    ("name-trailing-space", change("name", "kept "), "name", "must start with a letter or digit"),
    ("name-leading-dash", change("name", "-kept"), "name", "must start with a letter or digit"),
    ("name-slash", change("name", "a/b"), "name", "must start with a letter or digit"),
    ("name-non-ascii", change("name", "käpt"), "name", "must start with a letter or digit"),
    ("name-nul", change("name", "kept\x00"), "name", "must start with a letter or digit"),
    ("name-zero-width", change("name", "ke\u200bpt"), "name", "must start with a letter or digit"),
    ("name-too-long", change("name", "k" * 201), "name", "at most 200 characters"),
    ("name-empty", change("name", ""), "name", "non-empty string"),
    ("name-number", change("name", 5), "name", "non-empty string, got int"),
    ("name-list", change("name", ["kept"]), "name", "non-empty string, got list"),
    ("name-missing", change("name", KeyError), "name", "is required"),
    # step names: no invisible characters, no look-alikes
    ("step-name-newline", change("steps/0/name", "a\nb"), "steps[0].name", "(U+000A)"),
    ("step-name-bidi-override", change("steps/0/name", "abc\u202etxt"), "steps[0].name", "(U+202E)"),
    ("step-name-zero-width", change("steps/0/name", "fir\u200bst"), "steps[0].name", "(U+200B)"),
    ("step-name-bom", change("steps/0/name", "\ufefffirst"), "steps[0].name", "(U+FEFF)"),
    ("step-name-nul", change("steps/0/name", "first\x00"), "steps[0].name", "(U+0000)"),
    ("step-name-nbsp", change("steps/1/0/name", "le\u00a0ft"), "steps[1][0].name", "(U+00A0)"),
    ("step-name-surrogate", change("steps/0/name", "a\ud800"), "steps[0].name", "(U+D800)"),
    ("step-name-padded", change("steps/0/name", " first"), "steps[0].name", "white space"),
    ("step-name-not-nfc", change("steps/0/name", "caf\u0065\u0301"), "steps[0].name", "NFC"),
    ("step-name-too-long", change("steps/0/name", "s" * 201), "steps[0].name", "at most 200 characters, got 201"),
    ("step-name-duplicate", change("steps/1/1/name", "left"), "steps[1][1].name", "already used by steps[1][0]"),
    # time zones: canonical IANA names only, spelled exactly
    ("zone-localtime", change("timezone", "localtime"), "timezone", "not an IANA time zone name"),
    ("zone-posixrules", change("timezone", "posixrules"), "timezone", "not an IANA time zone name"),
    ("zone-right", change("timezone", "right/UTC"), "timezone", "not an IANA time zone name"),
    ("zone-posix", change("timezone", "posix/Europe/London"), "timezone", "not an IANA time zone name"),
    ("zone-dotdot", change("timezone", "Etc/../Europe/London"), "timezone", "not an IANA time zone name"),
    ("zone-absolute", change("timezone", "/etc/localtime"), "timezone", "not an IANA time zone name"),
    ("zone-case", change("timezone", "europe/london"), "timezone", "not spelled as the IANA zone 'Europe/London'"),
    ("zone-alias", change("timezone", "US/Eastern"), "timezone", "alias; use the canonical zone 'America/New_York'"),
    ("zone-factory", change("timezone", "Factory"), "timezone", "not an IANA time zone name"),
    ("zone-newline", change("timezone", "UTC\n"), "timezone", "not an IANA time zone name"),
    ("zone-too-long", change("timezone", "Europe/" + "x" * 60), "timezone", "at most 64 characters"),
    ("zone-number", change("timezone", 0), "timezone", "non-empty string, got int"),
    # sizes
    ("payload-70k", change("payload", {"x": "y" * 70_000}), "payload", f"more than {MAX_JSON_BYTES}"),
    ("payload-20MB", change("payload", {"x": "y" * 20_000_000}), "payload", f"more than {MAX_JSON_BYTES}"),
    ("payload-many-keys", change("payload", {str(i): 0 for i in range(40_000)}), "payload", "more than 65536"),
    ("payload-deep", change("payload", {"x": nested(40)}), "payload", "nested at most 32 levels"),
    ("payload-nan", change("payload", {"n": math.nan}), "payload.n", "must be a finite number"),
    ("payload-surrogate", change("payload", {"s": "\udc00"}), "payload.s", "lone surrogate"),
    ("payload-list", change("payload", [1]), "payload", "must be an object, got list"),
    ("payload-string", change("payload", "x"), "payload", "must be an object, got string"),
    ("args-70k", change("steps/0/args", ["y" * 70_000]), "steps[0].args", "more than 65536"),
    ("kwargs-70k", change("steps/0/kwargs", {"k": "y" * 70_000}), "steps[0].kwargs", "more than 65536"),
    ("kwargs-inf", change("steps/0/kwargs", {"seconds": math.inf}), "steps[0].kwargs.seconds", "finite number"),
    ("args-huge-int", change("steps/0/args", [10**30]), "steps[0].args[0]", "at most 64 bits"),
    ("kwargs-deep", change("steps/1/0/kwargs", {"k": nested(40)}), "steps[1][0].kwargs", "nested at most 32"),
    ("groups-101", steps(101, 1), "steps", "at most 100 step groups, got 101"),
    ("group-of-101", steps(1, 101), "steps[0]", "holds at most 100 steps, got 101"),
    ("steps-600", steps(6, 100), "steps", "at most 500 steps in all, got 600"),
    ("steps-10000", steps(100, 100), "steps", "at most 500 steps in all, got 10000"),
    (
        "definition-300k",
        change("steps", [{"name": f"s{i}", "task": SLEEP, "args": ["y" * 60_000]} for i in range(5)]),
        "definition",
        "more than 262144",
    ),
    # types and shapes
    ("queue-space", change("steps/0/queue", "a b"), "steps[0].queue", "not a queue name"),
    ("queue-newline", change("steps/0/queue", "q\n"), "steps[0].queue", "not a queue name"),
    ("queue-too-long", change("steps/0/queue", "q" * 201), "steps[0].queue", "not a queue name"),
    ("queue-number", change("steps/0/queue", 5), "steps[0].queue", "non-empty string, got int"),
    ("task-space", change("steps/0/task", "chordbeat.examples. sleep"), "steps[0].task", "not a Celery task name"),
    ("task-unknown", change("steps/0/task", "no.such.task"), "steps[0].task", "not registered"),
    ("task-too-long", change("steps/0/task", "t" * 201), "steps[0].task", "not a Celery task name"),
    ("step-kind-list", change("steps/0/kind", []), "steps[0].kind", "must be one of task, executable, sql, got []"),
    ("step-kind-huge", change("steps/0/kind", "k" * 10_000), "steps[0].kind", "got 'kkkkkkkkkk"),
    ("unknown-field", change("colour", "blue"), "colour", "unknown field"),
    ("unknown-huge-field", change("x" * 10_000, 1), "'xxxxxxxxxxxx", "unknown field"),
    ("unknown-step-field", change("steps/0/retries", 3), "steps[0].retries", "unknown field"),
    ("overlap-huge", change("overlap", "x" * 100_000), "overlap", "must be one of"),
    ("enabled-string", change("enabled", "yes"), "enabled", "true or false"),
    ("steps-object", change("steps", {"a": 1}), "steps", "non-empty list"),
    ("steps-empty", change("steps", []), "steps", "non-empty list"),
    ("group-empty", change("steps/1", []), "steps[1]", "at least one step"),
    ("step-string", change("steps/0", "first"), "steps[0]", "must be an object, got string"),
    ("definition-list", whole([base()]), "definition", "must be an object, got list"),
    ("definition-string", whole("kept"), "definition", "must be an object, got string"),
    ("definition-null", whole(None), "definition", "must be an object, got null"),
]


@SQLITE_ONLY
@pytest.mark.parametrize(("make", "field", "reason"), [pytest.param(m, f, r, id=i) for i, m, f, r in DEFINITIONS])
def test_a_bad_definition_is_refused_naming_the_field_and_stores_nothing(
    app: ChordbeatCelery, stored: dict[str, Any], make: Callable[[], Any], field: str, reason: str
) -> None:
    with pytest.raises(DefinitionError) as caught:
        service.apply_schedule(app, make())
    assert caught.value.field.startswith(field), str(caught.value)
    assert reason in caught.value.reason
    assert len(str(caught.value)) < 400, "messages stay short whatever the input"
    assert state(app) == stored


# --- service task arguments -------------------------------------------------------------------

NAME_TASKS = ("delete_schedule", "get_schedule", "pause_schedule", "resume_schedule", "trigger_schedule", "list_slots")
ID_TASKS = ("get_execution", "cancel_execution")
#: A fire_batch slot that is fine (the batch around it is what is wrong).
SLOT = {"name": "kept", "nominal_at": "2026-01-01T00:00:00+00:00", "trigger": "interval"}
SLOT_NO_NAME = {"nominal_at": "2026-01-01T00:00:00+00:00", "trigger": "interval"}

ARGUMENTS: list[tuple[str, str, dict[str, Any], str, str]] = [
    *[
        (f"{task}-{label}", task, {"name": value}, "name", reason)
        for task in NAME_TASKS
        for label, value, reason in (
            ("list", ["kept"], "must be a schedule name (a string), got list"),
            ("object", {"name": "kept"}, "got object"),
            ("null", None, "got null"),
            ("too-long", "k" * 201, "must be 1 to 200 characters, got 201"),
        )
    ],
    *[(f"{task}-empty-name", task, {"name": ""}, "name", "got 0") for task in ("get_schedule", "delete_schedule")],
    # The database drivers choke on these (PostgreSQL: NUL; both: lone surrogates).
    ("get-name-nul", "get_schedule", {"name": "kept\x00"}, "name", "must not hold NUL characters"),
    ("pause-name-surrogate", "pause_schedule", {"name": "\ud800"}, "name", "lone surrogates"),
    ("slots-name-surrogate", "list_slots", {"name": "k\udfff"}, "name", "lone surrogates"),
    ("list-schedule-nul", "list_executions", {"schedule": "\x00"}, "schedule", "must not hold NUL"),
    *[
        (f"{task}-{label}", task, {"execution_id": value}, "execution_id", reason)
        for task in ID_TASKS
        for label, value, reason in (
            ("true", True, "must be an integer (an execution id), got boolean"),
            ("string", "abc", "got string"),
            ("numeric-string", "1", "got string"),
            ("float", 1.0, "got float"),
            ("huge", 10**30, "between 1 and 2147483647, got 1000000000000000000000000000000"),
            ("zero", 0, "between 1 and 2147483647, got 0"),
            ("negative", -1, "got -1"),
            ("over-int4", 2**31, "got 2147483648"),
            ("null", None, "got null"),
            ("list", [1], "got list"),
        )
    ],
    ("list-limit-true", "list_executions", {"limit": True}, "limit", "between 1 and 500, got boolean"),
    ("list-limit-0", "list_executions", {"limit": 0}, "limit", "between 1 and 500, got 0"),
    ("list-limit-501", "list_executions", {"limit": 501}, "limit", "got 501"),
    ("list-limit-huge", "list_executions", {"limit": 10**30}, "limit", "between 1 and 500"),
    ("list-limit-string", "list_executions", {"limit": "10"}, "limit", "got string"),
    ("list-limit-float", "list_executions", {"limit": 1.5}, "limit", "got float"),
    ("list-limit-null", "list_executions", {"limit": None}, "limit", "got null"),
    ("list-status-unknown", "list_executions", {"status": "exploded"}, "status", "must be one of in_progress"),
    ("list-status-number", "list_executions", {"status": 5}, "status", "got int"),
    ("list-status-list", "list_executions", {"status": ["failed"]}, "status", "got list"),
    ("list-schedule-number", "list_executions", {"schedule": 5}, "schedule", "got int"),
    ("list-schedule-list", "list_executions", {"schedule": ["kept"]}, "schedule", "got list"),
    ("list-schedule-too-long", "list_executions", {"schedule": "k" * 201}, "schedule", "got 201"),
    ("slots-limit-0", "list_slots", {"name": "kept", "limit": 0}, "limit", "got 0"),
    ("slots-limit-true", "list_slots", {"name": "kept", "limit": True}, "limit", "got boolean"),
    ("trigger-payload-list", "trigger_schedule", {"name": "kept", "payload": [1]}, "payload", "got list"),
    ("trigger-payload-string", "trigger_schedule", {"name": "kept", "payload": "x"}, "payload", "got string"),
    ("trigger-payload-bool", "trigger_schedule", {"name": "kept", "payload": True}, "payload", "got boolean"),
    (
        "trigger-payload-70k",
        "trigger_schedule",
        {"name": "kept", "payload": {"x": "y" * 70_000}},
        "payload",
        f"more than {MAX_JSON_BYTES}",
    ),
    ("trigger-payload-nan", "trigger_schedule", {"name": "kept", "payload": {"n": math.nan}}, "payload.n", "finite"),
    ("trigger-payload-deep", "trigger_schedule", {"name": "kept", "payload": {"d": nested(40)}}, "payload", "nested"),
    (
        "trigger-payload-surrogate",
        "trigger_schedule",
        {"name": "kept", "payload": {"s": "\ud800"}},
        "payload.s",
        "surrogate",
    ),
    ("apply-list", "apply_schedule", {"definition": [base()]}, "definition", "must be an object, got list"),
    ("apply-null", "apply_schedule", {"definition": None}, "definition", "got null"),
    ("apply-every-1e-7", "apply_schedule", {"definition": change("every", 1e-7)()}, "every", "between 1 and"),
    ("apply-name-newline", "apply_schedule", {"definition": change("name", "kept\n")()}, "name", "got 'kept\\n'"),
    ("missing-argument", "get_schedule", {}, "arguments", "missing a required argument: 'name'"),
    ("unknown-argument", "get_execution", {"execution_id": 1, "colour": "x"}, "arguments", "unexpected keyword"),
    ("no-definition", "apply_schedule", {}, "arguments", "missing a required argument: 'definition'"),
    ("list-schedules-argument", "list_schedules", {"name": "kept"}, "arguments", "unexpected keyword"),
    # Internal tasks are reachable by anyone who can publish too.
    (
        "fire-future-slot",
        "fire_schedule",
        {"name": "kept", "nominal_at": "2999-01-01T00:00:00+00:00"},
        "nominal_at",
        "in the future",
    ),
    ("fire-naive-slot", "fire_schedule", {"name": "kept", "nominal_at": "2026-01-01T00:00:00"}, "nominal_at", "offset"),
    ("fire-slot-number", "fire_schedule", {"name": "kept", "nominal_at": 5}, "nominal_at", "ISO 8601"),
    ("fire-manual-trigger", "fire_schedule", {"name": "kept", "trigger": "manual"}, "trigger", "must be one of"),
    ("fire-name-list", "fire_schedule", {"name": ["kept"]}, "name", "schedule name"),
    ("batch-not-list", "fire_batch", {"fires": {"name": "kept"}}, "fires", "100 slots, got object"),
    ("batch-empty", "fire_batch", {"fires": []}, "fires", "must be a list of 1 to 100 slots, got 0 slots"),
    ("batch-101", "fire_batch", {"fires": [SLOT] * 101}, "fires", "got 101 slots"),
    ("batch-bool", "fire_batch", {"fires": True}, "fires", "got boolean"),
    ("batch-slot-string", "fire_batch", {"fires": [SLOT, "kept"]}, "fires[1]", "got string"),
    (
        "batch-slot-extra",
        "fire_batch",
        {"fires": [{**SLOT, "payload": {}}]},
        "fires[0]",
        "name, nominal_at and trigger",
    ),
    (
        "batch-slot-lookalike",
        "fire_batch",
        {"fires": [{**SLOT_NO_NAME, "Name": "kept"}]},
        "fires[0]",
        "got keys ['Name', 'nominal_at', 'trigg",
    ),
    ("batch-slot-missing", "fire_batch", {"fires": [SLOT_NO_NAME]}, "fires[0]", "name, nominal_at and trigger"),
    ("batch-slot-null-time", "fire_batch", {"fires": [{**SLOT, "nominal_at": None}]}, "fires[0].nominal_at", "null"),
    (
        "batch-slot-future",
        "fire_batch",
        {"fires": [SLOT, {**SLOT, "nominal_at": "2999-01-01T00:00:00+00:00"}]},
        "fires[1].nominal_at",
        "in the future",
    ),
    ("batch-slot-nan", "fire_batch", {"fires": [{**SLOT, "nominal_at": math.nan}]}, "fires[0].nominal_at", "ISO 8601"),
    ("batch-slot-manual", "fire_batch", {"fires": [{**SLOT, "trigger": "manual"}]}, "fires[0].trigger", "one of"),
    ("batch-slot-name-bool", "fire_batch", {"fires": [{**SLOT, "name": True}]}, "fires[0].name", "schedule name"),
    ("batch-slot-name-huge", "fire_batch", {"fires": [{**SLOT, "name": "k" * 10_000}]}, "fires[0].name", "1 to"),
    ("advance-bool", "advance_execution", {"execution_id": True, "step_index": 0}, "execution_id", "got boolean"),
    ("advance-index", "advance_execution", {"execution_id": 1, "step_index": -1}, "step_index", "between 0"),
    ("run-step-text", "run_step", {"worker_task_id": "1", "attempt": 1}, "worker_task_id", "must be an integer"),
    ("run-step-attempt", "run_step", {"worker_task_id": 1, "attempt": 10**30}, "attempt", "between 1 and 1000"),
]


@SQLITE_ONLY
@pytest.mark.parametrize(
    ("task", "kwargs", "field", "reason"), [pytest.param(t, k, f, r, id=i) for i, t, k, f, r in ARGUMENTS]
)
def test_a_bad_service_argument_is_refused_naming_it_and_writes_nothing(
    app: ChordbeatCelery, stored: dict[str, Any], task: str, kwargs: dict[str, Any], field: str, reason: str
) -> None:
    # The task object itself: the worker runs exactly this, argument check included.
    with pytest.raises(ChordbeatError) as caught:
        app.tasks[f"chordbeat.{task}"](**kwargs)
    assert isinstance(caught.value, FieldError)
    assert caught.value.field == field, str(caught.value)
    assert reason in caught.value.reason
    assert state(app) == stored


def test_bad_arguments_from_a_plain_celery_client_come_back_as_named_errors(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    """Every argument case, through the broker and the real worker, on SQLite and PostgreSQL."""
    call(client, "chordbeat.apply_schedule", definition=base())
    before = settled(app, call(client, "chordbeat.trigger_schedule", name="kept")["execution_id"], client)
    for label, task, kwargs, field, reason in ARGUMENTS:
        with pytest.raises(FieldError) as caught:
            call(client, f"chordbeat.{task}", **kwargs)
        # The client has chordbeat's classes, so the error is rebuilt as the class itself.
        expected = DefinitionError if task == "apply_schedule" and field != "arguments" else InvalidArgument
        assert type(caught.value) is expected, label
        assert (caught.value.field, reason in caught.value.reason) == (field, True), (label, str(caught.value))
    assert state(app) == before


def test_a_client_without_chordbeat_sees_the_class_name_and_the_argument(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    script = """
import sys
from celery import Celery
client = Celery(broker=sys.argv[1], backend=sys.argv[1])
client.conf.update(task_serializer="json", accept_content=["json"], result_accept_content=["json"])
for kwargs in ({"execution_id": True}, {"execution_id": "abc"}):
    try:
        client.send_task("chordbeat.get_execution", kwargs=kwargs).get(timeout=20)
    except Exception as exc:
        print(type(exc).__name__, "|", exc)
assert "celeryapp" not in sys.modules
"""
    url = app.settings.broker_url
    done = subprocess.run([sys.executable, "-c", script, url], capture_output=True, text=True, timeout=60, cwd="/")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "InvalidArgument | execution_id: must be an integer (an execution id), got boolean",
        "InvalidArgument | execution_id: must be an integer (an execution id), got string",
    ]


# --- schedule files ---------------------------------------------------------------------------

GOOD_FILE = "schedules:\n  - name: from-file\n    every: 60\n    steps: [{name: s, task: chordbeat.examples.sleep}]\n"
STEP = "[{name: s, task: chordbeat.examples.sleep}]"
FILES: list[tuple[str, str | bytes, str]] = [
    (
        "anchor-and-alias",
        f"schedules:\n  - &a {{name: x, every: 5, steps: {STEP}}}\n  - *a\n",
        "line 2, column 5: YAML anchors (&a)",
    ),
    (
        "billion-laughs",
        'a: &a ["lol","lol"]\nb: &b [*a,*a]\nc: &c [*b,*b]\nschedules: [*c]\n',
        "line 1, column 4: YAML anchors",
    ),
    ("alias-undefined", "schedules: [*nowhere]\n", "line 1, column 13: YAML aliases (*nowhere)"),
    (
        "merge-key",
        f"schedules:\n  - <<: {{every: 5}}\n    name: x\n    steps: {STEP}\n",
        "line 2, column 5: YAML merge keys",
    ),
    (
        "duplicate-top-key",
        "schedules: []\nschedules: []\n",
        "line 2, column 1: duplicate key 'schedules' (first on line 1)",
    ),
    (
        "duplicate-field",
        f"schedules:\n  - name: x\n    every: 5\n    every: 3600\n    steps: {STEP}\n",
        "line 4, column 5: duplicate key 'every' (first on line 3)",
    ),
    (
        "duplicate-step-field",
        "schedules:\n  - name: x\n    every: 5\n    steps:\n"
        "      - {name: s, task: chordbeat.examples.sleep, name: t}\n",
        "line 5, column 51: duplicate key 'name' (first on line 5)",
    ),
    ("too-deep", "schedules: " + "[" * 100 + "]" * 100 + "\n", "nested more than 64 levels deep"),
    ("too-big", "# padding\n" * 500_000, "is larger than 4194304 bytes"),
    ("not-utf8", b"schedules: [\xff]\n", "is not UTF-8 text (byte 12)"),
    ("not-yaml", "schedules: [unclosed\n", "line 1, column 12: a '[' is never closed with ']'"),
    ("huge-int", "schedules: [{name: x, every: " + "9" * 5000 + "}]\n", "is not valid YAML"),
    (
        "python-tag",
        "schedules: [!!python/object:os.system {}]\n",
        "column 13: the tag !!python/object:os.system is not",
    ),
    ("not-a-mapping", "- name: x\n", "must be a mapping with the keys 'schedules' and (optional) 'source'"),
    ("extra-key", "schedules: []\nextra: 1\n", "must be a mapping with the keys 'schedules' and (optional) 'source'"),
    (
        "date-in-payload",
        f"schedules: [{{name: x, every: 5, payload: {{at: 2024-01-01}}, steps: {STEP}}}]\n",
        "schedules[0] (x).payload.at: must be plain JSON, got date",
    ),
    (
        "binary-in-kwargs",
        "schedules: [{name: x, every: 5, steps: [{name: s, task: chordbeat.examples.sleep,"
        " kwargs: {b: !!binary aGk=}}]}]\n",
        "schedules[0] (x).steps[0].kwargs.b: must be plain JSON, got bytes",
    ),
    (
        "bad-every",
        f"schedules: [{{name: x, every: 1.0e-7, steps: {STEP}}}]\n",
        "schedules[0] (x).every: must be between 1 and",
    ),
    (
        "bad-name-not-echoed",
        f'schedules: [{{name: "x\\n", every: 5, steps: {STEP}}}]\n',
        "schedules[0].name: must start",
    ),
    (
        "twice",
        f"schedules: [{{name: x, every: 5, steps: {STEP}}}, {{name: x, every: 6, steps: {STEP}}}]\n",
        "schedules[1] (x).name: schedule 'x' appears twice",
    ),
]


@pytest.fixture
def file_applied(app: ChordbeatCelery, tmp_path: Path) -> dict[str, Any]:
    good = tmp_path / "good.yaml"
    good.write_text(GOOD_FILE)
    assert apply_file(app, good).added == ["from-file"]
    return state(app)


@SQLITE_ONLY
@pytest.mark.parametrize(("text", "reason"), [pytest.param(t, r, id=i) for i, t, r in FILES])
def test_a_bad_schedule_file_is_refused_naming_the_place_and_changes_nothing(
    app: ChordbeatCelery, file_applied: dict[str, Any], tmp_path: Path, text: str | bytes, reason: str
) -> None:
    path = tmp_path / "bad.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    started = time.monotonic()
    with pytest.raises(DefinitionError) as caught:
        apply_file(app, path)
    assert time.monotonic() - started < 10
    assert reason in str(caught.value)
    assert len(str(caught.value)) < 400
    assert state(app) == file_applied


# --- the exploits of the security review ------------------------------------------------------


@SQLITE_ONLY
def test_the_smallest_interval_stored_keeps_beat_computable(app: ChordbeatCelery) -> None:
    """``every: 1e-7`` used to be stored, then beat died on ZeroDivisionError computing its slots;
    ``every: 0.001`` fired ten times a second. Now 1 s is the least that can be stored."""
    for tiny in (1e-7, 0.001, 0.999):
        with pytest.raises(DefinitionError, match="every: must be between 1 and"):
            service.apply_schedule(app, change("every", tiny)())
    service.apply_schedule(app, change("every", 1)())
    with transaction(app.settings.database_url, read_only=True) as session:
        schedule = session.scalars(select(Schedule)).one()
        entry = CadenceSchedule(cadence_of(schedule))
        now = utcnow()
        assert 0 <= entry.remaining_estimate(now).total_seconds() <= 1
        assert entry.is_due(now).next <= 1


@SQLITE_ONLY
def test_ten_thousand_steps_are_refused_before_any_is_looked_at(app: ChordbeatCelery) -> None:
    """They used to be stored, and each trigger held SQLite's write lock for 2.5 s."""
    started = time.monotonic()
    with pytest.raises(DefinitionError, match="steps: must hold at most 500 steps in all, got 10000"):
        service.apply_schedule(app, steps(100, 100)())
    assert time.monotonic() - started < 1
    assert state(app)["rows"]["schedules"] == 0


def test_a_twenty_megabyte_trigger_payload_is_refused(app: ChordbeatCelery, worker: Any, client: Celery) -> None:
    """It used to be stored, and ``list_executions`` then returned 108 MB. Now its message is over
    ``CHORDBEAT_MAX_MESSAGE_BYTES``: dropped before it is decoded, its caller told why; a payload
    under that bound but over the payload's is refused naming the field."""
    call(client, "chordbeat.apply_schedule", definition=base())
    before = settled(app, call(client, "chordbeat.trigger_schedule", name="kept")["execution_id"], client)
    with pytest.raises(DecodeError, match="longer than CHORDBEAT_MAX_MESSAGE_BYTES"):
        call(client, "chordbeat.trigger_schedule", name="kept", payload={"blob": "y" * 20_000_000})
    with pytest.raises(InvalidArgument, match=f"payload: is 2000011 bytes of JSON, more than {MAX_JSON_BYTES}"):
        call(client, "chordbeat.trigger_schedule", name="kept", payload={"blob": "y" * 2_000_000})
    # Many small values are not even walked to the end.
    with pytest.raises(InvalidArgument, match=f"payload: is more than {MAX_JSON_BYTES} bytes of JSON"):
        call(client, "chordbeat.trigger_schedule", name="kept", payload={"blob": [0] * 1_000_000})
    assert state(app) == before


def test_a_call_nested_800_deep_is_answered_naming_the_argument(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    """Refused at decoding (the worker lives), its caller used to hear nothing and time out. The
    message's headers name its id, so it is answered at once, naming the argument."""
    call(client, "chordbeat.apply_schedule", definition=base())
    before = state(app)
    previous = sys.getrecursionlimit()
    sys.setrecursionlimit(max(previous, 10_000))  # the sender's own encoder recurses through what it sends
    try:
        for args, kwargs, field in (
            ((), {"name": "kept", "payload": {"d": nested(800)}}, "kwargs.payload"),
            (("kept", nested(800)), {}, "args"),
        ):
            with pytest.raises(InvalidArgument) as caught:
                answer(client.send_task("chordbeat.trigger_schedule", args=args, kwargs=kwargs), 20)
            assert (caught.value.field, caught.value.reason) == (field, "nested more than 100 levels deep")
    finally:
        sys.setrecursionlimit(previous)
    assert state(app) == before
    assert call(client, "chordbeat.get_schedule", name="kept")["name"] == "kept"  # the worker lives


def test_get_execution_of_true_is_not_execution_one(app: ChordbeatCelery, worker: Any, client: Celery) -> None:
    call(client, "chordbeat.apply_schedule", definition=base())
    first = call(client, "chordbeat.trigger_schedule", name="kept")["execution_id"]
    assert first == 1 and call(client, "chordbeat.get_execution", execution_id=1)["id"] == 1
    with pytest.raises(InvalidArgument, match="execution_id: must be an integer"):
        call(client, "chordbeat.get_execution", execution_id=True)
    with pytest.raises(InvalidArgument, match="execution_id: must be an integer"):
        call(client, "chordbeat.cancel_execution", execution_id=True)
    finished(client, first)


def test_lists_leave_out_large_payloads_that_get_execution_returns_whole(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    """Lists carry summaries, never payloads (tests/test_lists.py checks their size bound)."""
    call(client, "chordbeat.apply_schedule", definition=base())
    big = {"blob": "y" * 60_000}
    execution_id = call(client, "chordbeat.trigger_schedule", name="kept", payload=big)["execution_id"]
    finished(client, execution_id)
    listed = {e["id"]: e for e in call(client, "chordbeat.list_executions", schedule="kept")}
    assert "payload" not in listed[execution_id] and len(json.dumps(listed[execution_id])) < 1000
    assert call(client, "chordbeat.get_execution", execution_id=execution_id)["payload"]["blob"] == big["blob"]


def at_the_limits() -> dict[str, Any]:
    return {
        **base(),
        "name": "at-the-limits",
        "every": 366 * DAY,
        "timeout": 7 * DAY,
        "max_retries": 1000,
        "total_repeats": 10**9,
        "steps": [{"name": "s", "task": SLEEP, "kwargs": {"seconds": 0.01}, "timeout": 7 * DAY, "max_attempts": 100}],
    }


def test_a_schedule_at_every_limit_runs_and_recovery_passes_over_it(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    """A step timeout of 1e300 used to be stored and broke advancement and every recovery pass;
    the largest values that can be stored now still run."""
    from celeryapp.recovery.recovery import recover

    created = call(client, "chordbeat.apply_schedule", definition=at_the_limits())
    assert created["timeout"] == 7 * DAY and created["next_run_at"] is not None
    execution_id = call(client, "chordbeat.trigger_schedule", name="at-the-limits")["execution_id"]
    assert finished(client, execution_id)["status"] == "completed"
    recover(app)
