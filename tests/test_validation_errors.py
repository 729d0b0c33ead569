"""Every mistake of a definition at once, and a schedule file's broken YAML in a person's words."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celeryapp.domain.problems import MAX_REPORTED_ERRORS
from celeryapp.domain.step_policy import StepRules
from celeryapp.domain.validation import parse_definition, parse_definitions
from celeryapp.errors import DefinitionError
from celeryapp.scheduling.schedule_file import read_file

#: What the workers have in these tests.
RULES = StepRules.without_policy(
    {"hr.import_people", "hr.export", "chordbeat.steps.executable", "chordbeat.steps.sql"}.__contains__
)
VALID: dict[str, Any] = {
    "name": "nightly-hr-sync",
    "cron": "0 2 * * *",
    "timezone": "America/New_York",
    "steps": [
        {"name": "HR import", "task": "hr.import_people", "kwargs": {"full": True}},
        [{"name": "export", "task": "hr.export"}, {"name": "export 2", "task": "hr.export"}],
        {"name": "last", "task": "hr.export"},
        {"name": "program", "kind": "executable", "argv": ["/bin/true"], "env": {"LANG": "C"}},
        {"name": "query", "kind": "sql", "script": "select 1", "database_env": "HR_DATABASE_URL"},
    ],
}
#: One mistake each, independent of the others: (the field the error must name, where, the value).
#: A path is a list of keys and indexes into the definition; a new key is added.
FAULTS: dict[str, tuple[tuple[str | int, ...], Any]] = {
    "name": (("name",), "nightly hr"),
    "timezone": (("timezone",), "US/Eastern"),
    "cron": (("cron",), "0 25 * * *"),
    "overlap": (("overlap",), "sometimes"),
    "payload": (("payload",), [1]),
    "enabled": (("enabled",), "yes"),
    "max_retries": (("max_retries",), -1),
    "retry_delay": (("retry_delay",), "soon"),
    "total_repeats": (("total_repeats",), 1.5),
    "timeout": (("timeout",), 0),
    "colour": (("colour",), "blue"),
    "steps[0].task": (("steps", 0, "task"), "hr.import_peple"),
    "steps[0].timeout": (("steps", 0, "timeout"), -5),
    "steps[0].size": (("steps", 0, "size"), 3),
    "steps[1][0].name": (("steps", 1, 0, "name"), " padded"),
    "steps[1][0].max_attempts": (("steps", 1, 0, "max_attempts"), 0),
    "steps[1][1].queue": (("steps", 1, 1, "queue"), "chordbeat.control"),
    "steps[2].args": (("steps", 2, "args"), "not a list"),
    "steps[2].continue_on_failure": (("steps", 2, "continue_on_failure"), "maybe"),
    "steps[3].argv": (("steps", 3, "argv"), ["true"]),
    "steps[3].cwd": (("steps", 3, "cwd"), "/tmp\0x"),
    "steps[3].env.LD_PRELOAD": (("steps", 3, "env", "LD_PRELOAD"), "/tmp/x.so"),
    "steps[3].env.PATH": (("steps", 3, "env", "PATH"), "/tmp"),
    "steps[4].script": (("steps", 4, "script"), 5),
    "steps[4].database_env": (("steps", 4, "database_env"), "CHORDBEAT_BROKER_URL"),
}
#: The issue's file: four mistakes that used to take four rounds.
FOUR_MISTAKES = ("name", "timezone", "cron", "steps[0].task")


def with_faults(names: list[str]) -> dict[str, Any]:
    definition = copy.deepcopy(VALID)
    for name in names:
        path, value = FAULTS[name]
        place: Any = definition
        for key in path[:-1]:
            place = place[key]
        place[path[-1]] = value
    return definition


def reported(definition: dict[str, Any]) -> list[str]:
    """The fields the error names, and as many "more" as it counts past the listing's cap."""
    with pytest.raises(DefinitionError) as caught:
        parse_definition(definition, rules=RULES)
    return [e.field for e in caught.value.errors] + ["more"] * caught.value.more


@settings(max_examples=200, deadline=None)
@given(faults=st.lists(st.sampled_from(sorted(FAULTS)), min_size=1, unique=True))
def test_every_injected_fault_is_reported_and_nothing_else(faults: list[str]) -> None:
    named = reported(with_faults(faults))
    listed = [field for field in named if field != "more"]
    assert len(named) == len(faults) and len(listed) == min(len(faults), MAX_REPORTED_ERRORS)
    assert set(listed) <= set(faults)
    if len(faults) <= MAX_REPORTED_ERRORS:
        assert sorted(listed) == sorted(faults)


def test_the_valid_definition_is_valid() -> None:
    parse_definition(VALID, rules=RULES)


def test_four_mistakes_make_one_error_naming_each_with_its_reason() -> None:
    with pytest.raises(DefinitionError) as caught:
        parse_definition(with_faults(list(FOUR_MISTAKES)), rules=RULES)
    error = caught.value
    assert str(error).splitlines() == [
        "name: must start with a letter or digit and hold only letters, digits, '.', '_' and '-' "
        "(at most 200 characters), got 'nightly hr'",
        "timezone: 'US/Eastern' is an alias; use the canonical zone 'America/New_York'",
        "cron: hour field: 25 is outside 0-23",
        "steps[0].task: task 'hr.import_peple' is not registered in the worker",
    ]
    # The first one's field and reason, for callers that read one; rebuilt from the message alone
    # (what a Celery result backend keeps), it holds all four again.
    assert (error.field, error.reason) == ("name", error.errors[0].reason)
    again = DefinitionError(*error.args)
    assert [str(e) for e in again.errors] == [str(e) for e in error.errors]
    assert type(again) is DefinitionError


def test_a_schedule_file_lists_every_mistake_of_every_schedule(tmp_path: Path) -> None:
    second = copy.deepcopy(VALID) | {"name": "other", "every": 60}
    del second["cron"]
    second["steps"][2]["task"] = "hr.nope"
    with pytest.raises(DefinitionError) as caught:
        parse_definitions([with_faults(list(FOUR_MISTAKES)), second], rules=RULES)
    assert [e.field for e in caught.value.errors] == [
        "schedules[0].name",
        "schedules[0].timezone",
        "schedules[0].cron",
        "schedules[0].steps[0].task",
        "schedules[1] (other).steps[2].task",
    ]


def test_a_check_that_needs_a_failed_field_is_skipped() -> None:
    # A bad queue: which workers' tasks apply is unknown, so the task is not checked against any.
    definition = with_faults(["steps[1][1].queue"])
    definition["steps"][1][1]["task"] = "hr.nope"
    assert reported(definition) == ["steps[1][1].queue"]


BROKEN_YAML = [
    (
        "schedules:\n  - name: a\n    cron 0 2 * *\n    every: 5\n",
        ["line 3, column 5: expected ':' after a key (write 'key: value')", "  3 |     cron 0 2 * *", "    |     ^"],
    ),
    (
        "schedules:\n  - name: a\n    cron: 0 2: *\n",
        [
            "line 3, column 14: a second ':' on one line; quote a value holding ': '",
            "  3 |     cron: 0 2: *",
            "    |              ^",
        ],
    ),
    (
        "schedules:\n\t- name: a\n",
        ["line 2, column 1: a tab; YAML is indented with spaces", "  2 |  - name: a", "    | ^"],
    ),
    (
        "schedules: [{name: a, every: 5}\n",
        [
            "line 1, column 12: a '[' is never closed with ']'",
            "  1 | schedules: [{name: a, every: 5}",
            "    |            ^",
        ],
    ),
    (
        "schedules:\n  - name: a\n every: 5\n",
        ["line 3, column 2: indented differently from the lines above it", "  3 |  every: 5", "    |  ^"],
    ),
]


@pytest.mark.parametrize(("text", "expected"), BROKEN_YAML)
def test_broken_yaml_says_where_and_what_with_the_line_and_a_caret(
    tmp_path: Path, text: str, expected: list[str]
) -> None:
    path = tmp_path / "hr.yaml"
    path.write_text(text)
    with pytest.raises(DefinitionError) as caught:
        read_file(path, rules=None)
    assert caught.value.field == str(path)
    assert caught.value.reason.splitlines() == expected
    for word in ("yaml.", "Error", "while scanning", "while parsing", "<block", "<stream", "Mark"):
        assert word not in str(caught.value)
    # Rebuilt from its message, the excerpt stays with its error.
    again = DefinitionError(*caught.value.args)
    assert len(again.errors) == 1 and again.reason.splitlines() == expected
