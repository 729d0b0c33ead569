"""Shared limit definitions, pure: read from hostile JSON, every mistake at once naming its field;
a key template rendered per step run; a step's ``uses``."""

from __future__ import annotations

from typing import Any

import pytest

from celeryapp.domain.definition import LimitUse
from celeryapp.domain.shared_limits import (
    MAX_KEY_CHARS,
    MAX_SLOTS,
    KeyTemplate,
    LimitDefinition,
    OnFull,
    Rate,
    check_uses_known,
    parse_key_template,
    parse_limit,
    parse_uses,
)
from celeryapp.errors import DefinitionError, InvalidArgument


def problems(raw: Any) -> dict[str, str]:
    with pytest.raises(DefinitionError) as caught:
        parse_limit(raw)
    return {error.field: error.reason for error in caught.value.errors}


def test_a_full_definition_reads_back_as_written() -> None:
    raw = {
        "name": "warehouse",
        "slots": 3,
        "rate": "60/min",
        "key": "{payload.customer}",
        "per_key_slots": 1,
        "on_full": "skip",
        "max_wait": 600,
    }
    limit = parse_limit(raw)
    assert limit == LimitDefinition(
        "warehouse",
        3,
        Rate(60, 60.0, "60/min"),
        KeyTemplate("{payload.customer}", ("payload.customer",)),
        1,
        OnFull.SKIP,
        600.0,
    )
    assert limit.to_json() == raw
    assert parse_limit(limit.to_json()) == limit


def test_only_name_and_slots_are_needed() -> None:
    limit = parse_limit({"name": "erp", "slots": 1})
    assert limit.to_json() == {
        "name": "erp",
        "slots": 1,
        "rate": None,
        "key": None,
        "per_key_slots": None,
        "on_full": "queue",
        "max_wait": None,
    }


@pytest.mark.parametrize(
    ("rate", "count", "period_s"),
    [
        ("1/s", 1, 1.0),
        ("10/sec", 10, 1.0),
        ("5/seconds", 5, 1.0),
        ("60/min", 60, 60.0),
        ("2/minutes", 2, 60.0),
        ("100/h", 100, 3600.0),
        ("3/hour", 3, 3600.0),
        ("1/d", 1, 86400.0),
        ("7/days", 7, 86400.0),
        (" 4 / min ", 4, 60.0),
    ],
)
def test_rates_are_read_with_every_period_word(rate: str, count: int, period_s: float) -> None:
    parsed = parse_limit({"name": "api", "slots": 1, "rate": rate}).rate
    assert parsed is not None and (parsed.count, parsed.period_s) == (count, period_s)


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("slots", 0, "between 1 and 10000"),
        ("slots", -3, "between 1 and 10000"),
        ("slots", MAX_SLOTS + 1, "between 1 and 10000"),
        ("slots", 10**400, "between 1 and 10000"),
        ("slots", True, "must be an integer, got boolean"),
        ("slots", float("nan"), "must be an integer, got float"),
        ("slots", 2.5, "must be an integer"),
        ("slots", "3", "must be an integer, got string"),
        ("slots", None, "is required"),
        ("rate", "0/min", "N must be between 1"),
        ("rate", "-1/min", "written N/period"),
        ("rate", "60/fortnight", "not a period"),
        ("rate", "60 per minute", "written N/period"),
        ("rate", "١٢/min", "written N/period"),
        ("rate", 60, "must be a string"),
        ("rate", "9" * 50 + "/s", "at most 40 characters"),
        ("on_full", "drop", "must be one of queue, skip"),
        ("on_full", False, "got boolean"),
        ("max_wait", 0, "between 1 and"),
        ("max_wait", -5, "between 1 and"),
        ("max_wait", float("nan"), "got NaN"),
        ("max_wait", float("inf"), "between 1 and"),
        ("max_wait", True, "got boolean"),
        ("name", "w\u0430rehouse", "only ASCII letters"),  # a Cyrillic a: a look-alike
        ("name", "ware house", "only ASCII letters"),
        ("name", "-x", "start with a letter or digit"),
        ("name", "x" * 201, "at most 200 characters"),
        ("name", ["warehouse"], "got list"),
        ("name", None, "is required"),
    ],
)
def test_hostile_values_are_refused_naming_the_field(field: str, value: Any, words: str) -> None:
    raw = {"name": "warehouse", "slots": 3, field: value}
    found = problems(raw)
    assert words in found[field], found


@pytest.mark.parametrize(
    ("key", "words"),
    [
        ("", "non-empty string"),
        ("customer", "must hold a placeholder"),
        ("{payload}", "is not a placeholder"),
        ("{payload.}", "is not a placeholder"),
        ("{payload.a.b}", "is not a placeholder"),
        ("{execution}", "is not a placeholder"),
        ("{ schedule }", "is not a placeholder"),
        ("{schedule", "opens or closes no placeholder"),
        ("schedule}", "opens or closes no placeholder"),
        ("{{schedule}}", "opens or closes no placeholder"),
        ("{step}" * 9, "at most 8 placeholders"),
        ("{step}" + "x" * 200, "at most 200 characters"),
        ("{step}\u200b", "invisible"),
        (["{step}"], "got list"),
    ],
)
def test_key_templates_name_only_payload_fields_schedule_and_step(key: Any, words: str) -> None:
    assert words in problems({"name": "w", "slots": 2, "key": key})["key"]


def test_per_key_slots_needs_a_key_and_fits_in_the_slots() -> None:
    assert "with a key only" in problems({"name": "w", "slots": 3, "per_key_slots": 1})["per_key_slots"]
    assert (
        "between 1 and 3" in problems({"name": "w", "slots": 3, "key": "{step}", "per_key_slots": 4})["per_key_slots"]
    )
    assert "boolean" in problems({"name": "w", "slots": 3, "key": "{step}", "per_key_slots": True})["per_key_slots"]


def test_every_mistake_is_reported_at_once() -> None:
    found = problems(
        {
            "name": "bad name",
            "slots": 0,
            "rate": "1/fortnight",
            "key": "{x}",
            "on_full": "wait",
            "max_wait": -1,
            "colour": "red",
        }
    )
    assert set(found) == {"name", "slots", "rate", "key", "on_full", "max_wait", "colour"}


def test_deep_or_huge_definitions_are_refused_before_they_are_walked() -> None:
    deep: Any = 1
    for _ in range(10_000):
        deep = [deep]
    assert "definition" in problems({"name": "w", "slots": 1, "rate": deep})
    assert "bytes of JSON" in problems({"name": "w", "slots": 1, "note": "x" * 10_000})["definition"]
    assert "must be an object" in problems(["warehouse"])["definition"]


def test_a_key_renders_from_the_payload_schedule_and_step() -> None:
    template = parse_key_template("{payload.customer}/{schedule}/{step}/{payload.n}")
    assert template is not None
    assert (
        template.render(payload={"customer": "acme", "n": 7}, schedule="nightly", step="load") == "acme/nightly/load/7"
    )


@pytest.mark.parametrize(
    ("payload", "field", "words"),
    [
        ({}, "payload.customer", "has no such field"),
        ({"customer": None}, "payload.customer", "got null"),
        ({"customer": True}, "payload.customer", "got boolean"),
        ({"customer": 1.5}, "payload.customer", "got float"),
        ({"customer": {"id": 1}}, "payload.customer", "got object"),
        ({"customer": "   "}, "payload.customer", "empty key"),
        ({"customer": ""}, "payload.customer", "empty key"),
        ({"customer": "x" * (MAX_KEY_CHARS + 1)}, "payload.customer", "more than a limit's key"),
        ({"customer": "x" * MAX_KEY_CHARS}, "payload.customer", "more than 200"),
        ({"customer": "a\nb"}, "payload.customer", "control"),
    ],
)
def test_a_key_that_renders_empty_huge_or_from_a_missing_field_names_the_field(
    payload: dict[str, Any], field: str, words: str
) -> None:
    template = parse_key_template("{payload.customer}{payload.customer}")
    assert template is not None
    with pytest.raises(InvalidArgument) as caught:
        template.render(payload=payload, schedule="s", step="t")
    assert (caught.value.field, words in caught.value.reason) == (field, True), caught.value


def test_uses_are_names_or_objects_each_named_once() -> None:
    assert parse_uses(["warehouse", {"limit": "erp", "slots": 2}], "uses") == (
        LimitUse("warehouse"),
        LimitUse("erp", 2),
    )
    assert parse_uses(None, "uses") == ()
    with pytest.raises(DefinitionError) as caught:
        parse_uses(
            ["warehouse", "warehouse", {"limit": "erp", "slots": 0}, {"limit": "x", "n": 1}, 3, "bad name"], "s.uses"
        )
    assert {e.field: e.reason for e in caught.value.errors}.keys() == {
        "s.uses[1]",
        "s.uses[2].slots",
        "s.uses[3].n",
        "s.uses[4]",
        "s.uses[5]",
    }
    with pytest.raises(DefinitionError, match="at most 16"):
        parse_uses([f"l{i}" for i in range(17)], "uses")


def test_uses_must_name_defined_limits_with_room_for_what_they_ask() -> None:
    known = {
        "warehouse": parse_limit({"name": "warehouse", "slots": 3}),
        "erp": parse_limit({"name": "erp", "slots": 5, "key": "{step}", "per_key_slots": 2}),
    }
    check_uses_known((LimitUse("warehouse", 3), LimitUse("erp", 2)), known, "uses")
    with pytest.raises(DefinitionError) as caught:
        check_uses_known((LimitUse("warehouse", 4), LimitUse("erp", 3), LimitUse("nope")), known, "uses")
    found = {e.field: e.reason for e in caught.value.errors}
    assert found == {
        "uses[0].slots": "asks for 4 slots of 'warehouse', which has 3 in all",
        "uses[1].slots": "asks for 3 slots of 'erp', which has 2 per key",
        "uses[2]": "'nope' is not a defined limit",
    }
