"""The field-level difference of two definitions (pure): steps matched by name, nested objects
field by field; empty for a definition and itself, and made on the first it gives the second."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from celeryapp.domain.definition_versions import apply_differences, canonical_json, diff_definitions

STEP_NAMES = ["HR import", "a.b", "x]y", "notify", "s"]
KEYS = st.sampled_from(["full", "region", "a.b", "n", "deep"])
LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([1.0, 1.5]), st.text(max_size=3))
JSON = st.recursive(
    LEAVES, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(KEYS, inner, max_size=3)), max_leaves=8
)


@st.composite
def definitions(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from(STEP_NAMES), unique=True, max_size=len(STEP_NAMES)))
    steps = [
        {
            "name": name,
            "task": draw(st.sampled_from(["t.one", "t.two"])),
            "kwargs": draw(st.dictionaries(KEYS, JSON, max_size=3)),
            **draw(st.fixed_dictionaries({}, optional={"timeout": st.sampled_from([5, 7.5]), "env": JSON})),
        }
        for name in names
    ]
    groups: list[Any] = []
    while steps:
        size = draw(st.integers(1, len(steps)))
        taken, steps = steps[:size], steps[size:]
        groups.append(taken if size > 1 or draw(st.booleans()) else taken[0])
    fields = draw(
        st.fixed_dictionaries(
            {"name": st.just("nightly"), "timezone": st.sampled_from(["UTC", "Europe/Paris"])},
            optional={"every": st.sampled_from([60, 90.5]), "payload": JSON, "alerts": JSON},
        )
    )
    return {**fields, "steps": groups}


@settings(max_examples=100, deadline=None)
@given(a=definitions(), b=definitions())
def test_the_differences_made_on_a_give_b(a: dict[str, Any], b: dict[str, Any]) -> None:
    made = apply_differences(a, diff_definitions(a, b))
    assert canonical_json(made) == canonical_json(b)


@settings(max_examples=50, deadline=None)
@given(a=definitions())
def test_a_definition_does_not_differ_from_itself(a: dict[str, Any]) -> None:
    assert diff_definitions(a, a) == []
    assert apply_differences(a, []) == a


def test_a_changed_step_field_is_named_by_the_steps_name() -> None:
    step = {"name": "HR import", "task": "t.one", "kwargs": {"full": False}}
    a = {"name": "n", "every": 60, "steps": [step, {"name": "notify", "task": "t.two"}]}
    b = {"name": "n", "every": 60, "timezone": "UTC", "steps": [[{**step, "kwargs": {"full": True}}]]}
    assert [d.to_json() for d in diff_definitions(a, b)] == [
        {"path": "timezone", "op": "added", "old": None, "new": "UTC"},
        {"path": "steps[HR import].kwargs.full", "op": "changed", "old": False, "new": True},
        {"path": "steps[notify]", "op": "removed", "old": {"name": "notify", "task": "t.two"}, "new": None},
        {"path": "groups", "op": "changed", "old": ["HR import", "notify"], "new": [["HR import"]]},
    ]


def test_a_value_of_another_type_is_a_change_even_where_python_calls_them_equal() -> None:
    a, b = {"name": "n", "payload": {"flag": 1}}, {"name": "n", "payload": {"flag": True}}
    assert [d.path for d in diff_definitions(a, b)] == ["payload.flag"]
