"""The strict YAML loader on libyaml's parser: the same checks as the pure one, its refusals
worded by the pure one, about nine times faster on a large schedule file (docs/scaling.md)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from celeryapp.domain.strict_yaml import FastStrictLoader, StrictLoader, YamlMistake, read_yaml

STEP = "[{name: s, task: chordbeat.examples.sleep}]"
#: test_bad_input's hostile files (their YAML): each refused by both loaders, or read the same.
HOSTILE = {
    "billion-laughs": "a: &a [x, x]\nb: &b [*a, *a]\nc: [*b, *b]\n",
    "alias": f"schedules: [&s {{name: x, every: 5, steps: {STEP}}}, *s]\n",
    "merge-key": f"base: {{every: 5}}\nschedules: [{{<<: {{every: 5}}, name: x, steps: {STEP}}}]\n",
    "duplicate-top": "schedules: []\nschedules: []\n",
    "duplicate-field": f"schedules:\n  - name: x\n    every: 5\n    every: 3600\n    steps: {STEP}\n",
    "duplicate-step-field": "schedules:\n  - {name: x, every: 5, steps: [{name: s, task: t, name: u}]}\n",
    "too-deep": "schedules: " + "[" * 100 + "]" * 100 + "\n",
    "not-yaml": "schedules: [unclosed\n",
    "huge-int": "schedules: [{name: x, every: " + "9" * 5000 + "}]\n",
    "python-tag": "schedules: [!!python/object:os.system {}]\n",
    "date-in-payload": f"schedules: [{{name: x, every: 5, payload: {{at: 2024-01-01}}, steps: {STEP}}}]\n",
    "binary": "schedules: [{name: x, kwargs: {b: !!binary aGk=}}]\n",
    "control-character": 'schedules: [{name: "x\\u0007"}]\n',
    "tab-indent": "schedules:\n\t- name: x\n",
    "two-documents": "schedules: []\n---\nschedules: []\n",
    "yaml11-keys": "on: 1\noff: 2\nyes: 3\n'no': 4\ntrue: 5\n",
}


@pytest.mark.parametrize("text", HOSTILE.values(), ids=list(HOSTILE))
def test_the_libyaml_loader_refuses_what_the_pure_one_does_and_reads_the_same(text: str) -> None:
    """Both loaders refuse it, or both read the same document (its mistake is then the
    validation's)."""

    def outcome(loader: Any) -> Any:
        try:
            return "read", yaml.load(text, Loader=loader)
        except (yaml.YAMLError, ValueError) as exc:
            return "refused", type(exc).__name__
        except Exception as exc:
            return "refused", type(exc).__name__

    fast, pure = outcome(FastStrictLoader), outcome(StrictLoader)
    assert fast[0] == pure[0], (fast, pure)
    if pure[0] == "read":
        assert fast == pure


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("a: &x 1\nb: *x\n", "line 1, column 4: YAML anchors (&x) are not allowed"),
        ("a: 1\nb: 2\na: 3\n", "line 3, column 1: duplicate key 'a' (first on line 1)"),
        ("a: {<<: {b: 1}}\n", "YAML merge keys (<<) are not allowed"),
        ("a: [1, 2\n", "a '[' is never closed with ']'"),
        ("a: 1\n---\nb: 2\n", "expected a single document"),
    ],
)
def test_a_refusal_reads_as_the_pure_loaders_with_libyaml_beneath(text: str, said: str) -> None:
    with pytest.raises(YamlMistake, match=said.replace("[", "\\[").replace("(", "\\(").replace(")", "\\)")):
        read_yaml(text)


def test_plain_yaml_reads_the_same_on_both_loaders() -> None:
    text = (
        "source: hr\nschedules:\n  - name: x\n    every: 60\n    on: yes\n    payload: {a: 1.5, b: null, c: 'it''s',"
        " d: 2024-01-01, e: [true, no, ~], f: 0x1F, g: 1_000}\n    text: |\n      two\n      lines\n"
    )
    assert yaml.load(text, Loader=FastStrictLoader) == yaml.load(text, Loader=StrictLoader) == read_yaml(text)
    assert read_yaml(text)["schedules"][0]["on"] is True and "on" in read_yaml(text)["schedules"][0]
