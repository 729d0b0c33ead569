"""Definition versions: a schedule's definition as the canonical text a version stores, its hash,
and the field-level difference of two definitions (docs/versions.md).

A definition here is the JSON object a schedule's definition reads back as
(:meth:`ScheduleDefinition.to_json`), taken whole: a field added to definitions later is versioned
and compared without a change here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from celeryapp.domain.redaction import HIDDEN, hide_env_values

#: The diff's path of the layout of the steps: their names by group, a group written as a single
#: step (not a list) by its name alone.
GROUPS_PATH = "groups"

Op = Literal["added", "removed", "changed"]


def canonical_json(definition: Any) -> str:
    """The one text of a definition: sorted keys, no spaces, non-ASCII kept as it is."""
    return json.dumps(definition, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def definition_hash(text: str) -> str:
    """The hex SHA-256 of a definition's canonical text."""
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Difference:
    """One field that differs: ``keys`` locates it (the steps' fields under ``("steps", name)``),
    ``path`` says it as people read it (``steps[HR import].kwargs.full``)."""

    keys: tuple[str, ...]
    op: Op
    old: Any = None
    new: Any = None

    @property
    def path(self) -> str:
        if self.keys[0] == "steps":
            return ".".join([f"steps[{self.keys[1]}]", *self.keys[2:]])
        return ".".join(self.keys)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "op": self.op, "old": self.old, "new": self.new}

    def env_hidden(self) -> Difference:
        """This difference with the ``env`` values it shows hidden, as the schedule object hides
        them (they may be credentials): a change shows that one happened, not the values."""
        keys = self.keys
        if keys[0] != "steps" or (len(keys) > 2 and keys[2] != "env"):
            return self

        def hide(value: Any) -> Any:
            if value is None:
                return None
            if len(keys) == 2:
                return hide_env_values([value])[0]
            return dict.fromkeys(value, HIDDEN) if len(keys) == 3 and isinstance(value, dict) else HIDDEN

        return Difference(keys, self.op, hide(self.old), hide(self.new))


def diff_definitions(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[Difference]:
    """What changes from definition ``a`` to ``b``: fields added, removed or changed, nested objects
    compared field by field; steps matched by name, their layout (:data:`GROUPS_PATH`) apart."""
    out: list[Difference] = []
    rest_a = {k: v for k, v in a.items() if k != "steps"}
    rest_b = {k: v for k, v in b.items() if k != "steps"}
    _diff_objects(rest_a, rest_b, (), out)
    steps_a, steps_b = _steps_by_name(a.get("steps", [])), _steps_by_name(b.get("steps", []))
    for name in [*steps_a, *(n for n in steps_b if n not in steps_a)]:
        if name not in steps_b:
            out.append(Difference(("steps", name), "removed", old=steps_a[name]))
        elif name not in steps_a:
            out.append(Difference(("steps", name), "added", new=steps_b[name]))
        else:
            _diff_objects(steps_a[name], steps_b[name], ("steps", name), out)
    layout_a, layout_b = _layout(a.get("steps", [])), _layout(b.get("steps", []))
    if layout_a != layout_b:
        out.append(Difference((GROUPS_PATH,), "changed", old=layout_a, new=layout_b))
    return out


def apply_differences(a: Mapping[str, Any], differences: list[Difference]) -> dict[str, Any]:
    """Definition ``a`` with ``differences`` made: ``apply_differences(a, diff_definitions(a, b))``
    equals ``b``."""
    rest: dict[str, Any] = json.loads(canonical_json({k: v for k, v in a.items() if k != "steps"}))
    # Copies: the differences are made in place.
    steps = _steps_by_name(json.loads(canonical_json(list(a.get("steps", [])))))
    layout = _layout(a.get("steps", []))
    for difference in differences:
        keys = difference.keys
        if keys == (GROUPS_PATH,):
            layout = difference.new
            continue
        if keys[0] == "steps":
            if len(keys) == 2:
                if difference.op == "removed":
                    del steps[keys[1]]
                else:
                    steps[keys[1]] = difference.new
                continue
            target, keys = steps[keys[1]], keys[2:]
        else:
            target = rest
        *parents, last = keys
        for key in parents:
            target = target[key]
        if difference.op == "removed":
            del target[last]
        else:
            target[last] = difference.new
    if "steps" in a or steps:
        rest["steps"] = [[steps[n] for n in group] if isinstance(group, list) else steps[group] for group in layout]
    return rest


def _diff_objects(a: Any, b: Any, keys: tuple[str, ...], out: list[Difference]) -> None:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for key in [*a, *(k for k in b if k not in a)]:
            if key not in b:
                out.append(Difference((*keys, key), "removed", old=a[key]))
            elif key not in a:
                out.append(Difference((*keys, key), "added", new=b[key]))
            else:
                _diff_objects(a[key], b[key], (*keys, key), out)
    elif canonical_json(a) != canonical_json(b):
        # Compared as their texts: True and 1, or 1 and 1.0, are different definitions.
        out.append(Difference(keys, "changed", old=a, new=b))


def _steps_by_name(groups: Any) -> dict[str, Any]:
    return {step["name"]: step for group in groups for step in (group if isinstance(group, list) else [group])}


def _layout(groups: Any) -> list[Any]:
    return [[step["name"] for step in group] if isinstance(group, list) else group["name"] for group in groups]
