"""Definition validation: every error names the field and the reason; nothing half-stored."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from celery import Celery

from celeryapp.app import ChordbeatCelery
from celeryapp.definition import parse_definition
from celeryapp.errors import DefinitionError
from tests.conftest import call

KNOWN = {"chordbeat.examples.sleep", "chordbeat.examples.fail"}


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
    definition = copy.deepcopy(valid())
    target: Any = definition
    keys = path.split("/")
    for key in keys[:-1]:
        target = target[int(key)] if key.isdigit() else target[key]
    last = keys[-1]
    if value is KeyError:
        del target[last]
    elif isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return definition


def test_a_valid_definition_reads_back_as_written() -> None:
    parsed = parse_definition(valid(), known_task=KNOWN.__contains__)
    out = parsed.to_json()
    assert out["steps"] == valid()["steps"]
    assert out["overlap"] == "skip" and out["timezone"] == "Europe/London" and "every" not in out
    assert [len(g) for g in parsed.groups] == [1, 2]
    assert parse_definition(out, known_task=KNOWN.__contains__) == parsed


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
        parse_definition(with_change(path, value), known_task=KNOWN.__contains__)
    assert caught.value.field == field
    assert reason in caught.value.reason


def test_every_and_cron_together_are_refused() -> None:
    with pytest.raises(DefinitionError, match="exactly one"):
        parse_definition({**valid(), "every": 60}, known_task=None)


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
