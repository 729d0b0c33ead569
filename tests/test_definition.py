"""Definition validation: every error names the field and the reason; nothing half-stored."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from celery import Celery
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from celeryapp.application import ChordbeatCelery
from celeryapp.domain.cadence import Cadence, retry_delay_s
from celeryapp.domain.cron import CronExpression
from celeryapp.domain.definition import ScheduleDefinition, StepKind, StepSpec
from celeryapp.domain.problems import MAX_REPORTED_ERRORS
from celeryapp.domain.step_policy import StepRules
from celeryapp.domain.validation import parse_definition
from celeryapp.errors import DefinitionError
from celeryapp.scheduling.beat_entries import CadenceSchedule
from celeryapp.scheduling.store import upsert_schedule
from models import ScheduleSource, transaction
from models.audit import BEAT
from models.versions import VersionOrigin
from tests.support.helpers import call, set_field

KNOWN = {"chordbeat.examples.sleep", "chordbeat.examples.fail"}
#: No policy of the workers', only which tasks they have.
KNOWN_ONLY = StepRules.without_policy(KNOWN.__contains__)


def valid() -> dict[str, Any]:
    return {
        "name": "nightly-hr-sync",
        "cron": "0 2 * * *",
        "timezone": "Europe/London",
        "steps": [
            {"name": "a", "task": "chordbeat.examples.sleep", "kwargs": {"seconds": 1}},
            [
                {"name": "b", "task": "chordbeat.examples.sleep"},
                {"name": "c", "task": "chordbeat.examples.fail", "continue_on_failure": True},
            ],
        ],
    }


def with_change(path: str, value: Any) -> dict[str, Any]:
    return set_field(copy.deepcopy(valid()), path, value)


def test_a_valid_definition_reads_back_as_written() -> None:
    parsed = parse_definition(valid(), rules=KNOWN_ONLY)
    out = parsed.to_json()
    assert out["steps"] == valid()["steps"]
    assert out["overlap"] == "skip" and out["timezone"] == "Europe/London" and "every" not in out
    assert [len(g) for g in parsed.groups] == [1, 2]
    assert parse_definition(out, rules=KNOWN_ONLY) == parsed


@pytest.mark.parametrize(
    ("path", "value", "field", "reason"),
    [
        ("name", KeyError, "name", "is required"),
        ("name", "has space", "name", "must start with a letter or digit"),
        ("cron", "0 25 * * *", "cron", "hour field: 25 is outside 0-23"),
        ("cron", KeyError, "cron", "exactly one of 'cron' and 'every'"),
        ("every", 10, "cron", "exactly one of 'cron' and 'every'"),
        ("timezone", "Mars/Olympus", "timezone", "not an IANA time zone"),
        ("overlap", "sometimes", "overlap", "must be one of skip, buffer_one, cancel_previous, allow"),
        ("max_retries", -1, "max_retries", "between 0 and 1000"),
        ("max_retries", "3", "max_retries", "must be an integer"),
        ("timeout", 0, "timeout", "must be between 0.1 and 604800 seconds (7 days), got 0"),
        ("enabled", "yes", "enabled", "true or false"),
        ("payload", [1], "payload", "must be an object"),
        ("colour", "blue", "colour", "unknown field"),
        ("steps", [], "steps", "non-empty list"),
        ("steps/1", [], "steps[1]", "at least one step"),
        ("steps/0/task", "no.such.task", "steps[0].task", "not registered"),
        ("steps/0/name", "", "steps[0].name", "non-empty string"),
        ("steps/1/1/name", "b", "steps[1][1].name", "already used by steps[1][0]"),
        ("steps/1/0/kwargs", [1], "steps[1][0].kwargs", "must be an object"),
        ("steps/1/0/args", {"a": 1}, "steps[1][0].args", "must be a list"),
        ("steps/1/0/max_attempts", 0, "steps[1][0].max_attempts", "between 1 and 100"),
        ("steps/1/0/retries", 3, "steps[1][0].retries", "unknown field"),
        ("steps/0/continue_on_failure", 1, "steps[0].continue_on_failure", "true or false"),
    ],
)
def test_invalid_definitions_name_the_field_and_the_reason(path: str, value: Any, field: str, reason: str) -> None:
    with pytest.raises(DefinitionError) as caught:
        parse_definition(with_change(path, value), rules=KNOWN_ONLY)
    assert caught.value.field == field
    assert reason in caught.value.reason


def test_a_steps_kind_is_a_step_kind_and_reads_back_as_plain_json() -> None:
    sql = {"name": "s", "kind": "sql", "script": "select 1", "database_env": "CHORDBEAT_SQL_REPORTS"}
    program = {"name": "p", "kind": "executable", "argv": ["/bin/true"]}
    parsed = parse_definition({"name": "kinds", "every": 60, "steps": [sql, program, valid()["steps"][0]]})
    assert [group[0].kind for group in parsed.groups] == [StepKind.SQL, StepKind.EXECUTABLE, StepKind.TASK]
    steps = parsed.to_json()["steps"]
    assert steps[:2] == [sql, program] and [type(step.get("kind")) for step in steps] == [str, str, type(None)]
    assert json.loads(json.dumps(steps)) == steps
    assert [StepSpec.from_json(step) for step in steps] == [group[0] for group in parsed.groups]


def test_every_and_cron_together_are_refused() -> None:
    with pytest.raises(DefinitionError, match="exactly one"):
        parse_definition({**valid(), "every": 60}, rules=None)


def test_an_invalid_definition_sent_by_another_service_stores_nothing(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    call(client, "chordbeat.apply_schedule", definition={**valid(), "name": "kept"})
    with pytest.raises(Exception) as caught:
        call(client, "chordbeat.apply_schedule", definition=with_change("steps/1/1/task", "no.such.task"))
    assert "steps[1][1].task: task 'no.such.task' is not registered" in str(caught.value)
    # An invalid update of an existing schedule leaves the stored one as it was.
    broken = {**with_change("cron", "61 * * * *"), "name": "kept"}
    with pytest.raises(Exception, match=r"cron: minute field: 61 is outside 0-59"):
        call(client, "chordbeat.apply_schedule", definition=broken)
    schedules = call(client, "chordbeat.list_schedules")
    assert [s["name"] for s in schedules] == ["kept"]
    assert schedules[0]["cron"] == "0 2 * * *" and schedules[0]["steps"] == valid()["steps"]


def test_unknown_names_give_clear_errors(app: ChordbeatCelery, worker: Any, client: Celery) -> None:
    with pytest.raises(Exception, match="schedule 'nope' does not exist"):
        call(client, "chordbeat.get_schedule", name="nope")
    with pytest.raises(Exception, match="execution 404 does not exist"):
        call(client, "chordbeat.get_execution", execution_id=404)
    with pytest.raises(Exception, match="status: must be one of"):
        call(client, "chordbeat.list_executions", status="exploded")


# --- properties -------------------------------------------------------------------------------

DAY = 24 * 3600
UTC_TIMES = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC))
SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text()
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
#: Numbers around every bound, and anything else a number can be.
NUMBERS = (
    st.sampled_from([0, 0.0999, 0.1, 0.999, 1, 1e-7, 2.5, 7 * DAY, 7 * DAY + 1, 366 * DAY, 366 * DAY + 1e-6, 1e300])
    | st.integers()
    | st.floats()
    | st.booleans()
    | st.none()
)
CRON_FIELDS = st.sampled_from(["*", "*/7", "0", "5", "1-5", "0,30", "13", "29", "2", "mon", "jan", "1-31/2", "60", "x"])
CRONS = st.lists(CRON_FIELDS, min_size=4, max_size=6).map(" ".join) | st.text(max_size=30)
ZONES = st.sampled_from(["UTC", "Europe/London", "America/New_York", "Australia/Lord_Howe", "Asia/Kathmandu"]) | (
    st.text(max_size=20)
)
NAMES = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,10}", fullmatch=True) | st.text(max_size=12)
SCHEDULE_FIELDS_FUZZ = {
    "name": NAMES,
    "every": NUMBERS,
    "cron": CRONS,
    "timezone": ZONES,
    "timeout": NUMBERS,
    "retry_delay": NUMBERS,
    "max_retries": NUMBERS,
    "total_repeats": NUMBERS,
    "overlap": st.sampled_from(["skip", "allow", "buffer_one", "cancel_previous"]) | JSON_VALUES,
    "enabled": JSON_VALUES,
    "payload": JSON_VALUES,
    "steps": JSON_VALUES,
}
STEP_FIELDS_FUZZ = {
    "name": NAMES,
    "task": st.sampled_from(sorted(KNOWN)) | st.text(max_size=12),
    "timeout": NUMBERS,
    "max_attempts": NUMBERS,
    "queue": NAMES,
    "args": JSON_VALUES,
    "kwargs": JSON_VALUES,
    "continue_on_failure": JSON_VALUES,
    "kind": st.sampled_from(["task", "executable", "sql"]) | JSON_VALUES,
}


@st.composite
def near_valid(draw: st.DrawFn) -> dict[str, Any]:
    """A valid definition with some of its fields (and its first step's) replaced by fuzz."""
    definition = valid()
    if draw(st.booleans()):
        del definition["cron"]
        definition["every"] = 60
    for key in draw(st.lists(st.sampled_from(sorted(SCHEDULE_FIELDS_FUZZ)), max_size=3, unique=True)):
        value = draw(SCHEDULE_FIELDS_FUZZ[key])
        if key in ("cron", "every") and draw(st.booleans()):
            definition.pop("every" if key == "cron" else "cron", None)
        definition[key] = value
    if isinstance(definition.get("steps"), list) and definition["steps"]:
        step = definition["steps"][0]
        if isinstance(step, dict):
            for key in draw(st.lists(st.sampled_from(sorted(STEP_FIELDS_FUZZ)), max_size=3, unique=True)):
                step[key] = draw(STEP_FIELDS_FUZZ[key])
    return definition


def assert_fire_times_computable(definition: ScheduleDefinition, at: datetime) -> None:
    """Everything beat, firing, retries and recovery compute from a stored definition."""
    cadence = Cadence(definition.cron, definition.every_s, definition.timezone, anchor=at)
    upcoming = [cadence.slot_after(at)]
    for _ in range(3):
        upcoming.append(cadence.slot_after(upcoming[-1]))
    assert upcoming == sorted(set(upcoming)) and upcoming[0] > at
    assert cadence.latest_slot(upcoming[-1], since=at) == upcoming[-1]
    entry = CadenceSchedule.decode(CadenceSchedule(cadence).encode())
    assert entry.due(at).at == upcoming[0]
    for retry in {1, max(definition.max_retries, 1)}:
        assert at + timedelta(seconds=retry_delay_s(definition.retry_base_s, retry)) > at
    for timeout in [definition.timeout_s] + [s.timeout_s for group in definition.groups for s in group]:
        if timeout is not None:
            assert at + timedelta(seconds=timeout + 30) > at


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=JSON_VALUES | near_valid())
def test_parsing_anything_raises_only_definition_errors(raw: Any) -> None:
    try:
        parse_definition(raw, rules=KNOWN_ONLY)
    except DefinitionError as exc:
        # One line per mistake (there may be many), each of them short.
        assert exc.field and exc.reason and exc.errors
        assert all(e.field and e.reason and len(str(e)) < 600 for e in exc.errors)
        assert len(exc.errors) <= MAX_REPORTED_ERRORS


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(raw=near_valid(), now=UTC_TIMES, later=UTC_TIMES)
@pytest.mark.timeout(120)
def test_a_definition_that_parses_can_always_compute_its_fire_times(raw: Any, now: datetime, later: datetime) -> None:
    try:
        parsed = parse_definition(raw, rules=KNOWN_ONLY, now=now)
    except DefinitionError:
        assume(False)
        return
    assert_fire_times_computable(parsed, now)
    assert_fire_times_computable(parsed, later)
    # What is stored reads back as the same definition, as plain JSON.
    stored = json.loads(json.dumps(parsed.to_json(), allow_nan=False))
    assert parse_definition(stored, rules=KNOWN_ONLY, now=later) == parsed
    assert [[StepSpec.from_json(s) for s in group] for group in parsed.plan()] == [list(g) for g in parsed.groups]


@pytest.mark.parametrize(
    "cadence",
    [
        {"every": 90},
        {"cron": "30 2 * * *", "timezone": "Europe/Berlin", "dst": {"repeated": "both", "missing": "skip"}},
        {"cron": "*/15 * * * 1-5", "timezone": "America/New_York"},
    ],
)
def test_a_stored_definitions_next_fire_is_its_cadences_first_slot(database_url: str, cadence: dict[str, Any]) -> None:
    """Applying a definition stores its next fire as beat and the fire compute it (cadence_of),
    which is what the store computed on its own before: a cron's next time by its zone and DST
    rule, an interval's one interval on."""

    definition = parse_definition(
        {"name": "n", **cadence, "steps": [{"name": "a", "task": "chordbeat.examples.sleep"}]}
    )
    now = datetime(2026, 3, 29, 0, 59, 30, 250000, tzinfo=UTC)
    with transaction(database_url) as session:
        schedule, _ = upsert_schedule(
            session, definition, source=ScheduleSource.API, now=now, origin=VersionOrigin.of(BEAT)
        )
        stored = schedule.next_run_at
    if definition.cron is not None:
        expected = CronExpression.parse(definition.cron).next_after(now, definition.zone, definition.dst)
    else:
        expected = now + timedelta(seconds=cadence["every"])
    assert stored is not None and stored.replace(tzinfo=UTC) == expected
