"""Fields of untrusted JSON objects read with their types checked: each error names the field.

What both a schedule and its steps are made of: objects with known fields, strings, true or
false, integers and seconds within a range, JSON values within their caps (:mod:`limits`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from celeryapp.domain import limits
from celeryapp.domain.definition import NAME_PATTERN
from celeryapp.domain.limits import short_repr, type_name
from celeryapp.domain.problems import Problems
from celeryapp.errors import DefinitionError


def require_mapping(value: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise DefinitionError(path, f"must be an object, got {type_name(value)}")
    return value


def refuse_unknown(raw: Mapping[str, Any], allowed: frozenset[str], path: str) -> None:
    """Every field of ``raw`` not in ``allowed``, one error each."""
    unknown = sorted((k for k in raw if k not in allowed), key=str)
    if unknown:
        where = f"{path}." if path else ""
        reason = f"unknown field (allowed: {', '.join(sorted(allowed))})"
        labels = [key if isinstance(key, str) and NAME_PATTERN.fullmatch(key) else short_repr(key) for key in unknown]
        raise DefinitionError.every([DefinitionError(f"{where}{label}", reason) for label in labels])


def string_field(raw: Mapping[str, Any], key: str, path: str, *, required: bool = False) -> str | None:
    value = raw.get(key)
    if value is None:
        if required:
            raise DefinitionError(path, "is required")
        return None
    if not isinstance(value, str) or not value.strip():
        raise DefinitionError(path, f"must be a non-empty string, got {type_name(value)}")
    return value


def bool_field(raw: Mapping[str, Any], key: str, path: str, default: bool) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise DefinitionError(path, f"must be true or false, got {type_name(value)}")
    return value


def int_field(raw: Mapping[str, Any], key: str, path: str, default: int, *, low: int, high: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise DefinitionError(path, f"must be an integer, got {type_name(value)}")
    if not low <= value <= high:
        raise DefinitionError(path, f"must be between {low} and {high}, got {short_repr(value)}")
    return value


def seconds_field(
    raw: Mapping[str, Any], key: str, path: str, default: float | None, *, low: float, high: float
) -> float | None:
    value = raw.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DefinitionError(path, f"must be a number of seconds, got {type_name(value)}")
    # Compared before float(): an int too large for a float is just out of range.
    if isinstance(value, float) and value != value:
        raise DefinitionError(path, "must be a number of seconds, got NaN")
    if not low <= value <= high:
        bounds = f"{limits.seconds_text(low).removesuffix(' seconds')} and {limits.seconds_text(high)}"
        raise DefinitionError(path, f"must be between {bounds}, got {short_repr(value)}")
    return float(value)


def pattern_field(raw: Mapping[str, Any], key: str, path: str, pattern: re.Pattern[str], what: str) -> str | None:
    value = string_field(raw, key, path)
    if value is not None and not pattern.fullmatch(value):
        raise DefinitionError(path, f"{short_repr(value)} is not {what}")
    return value


def distinct_names(values: Sequence[Any], path: str, problem_of: Callable[[Any], str | None]) -> tuple[str, ...]:
    """``values`` in the order written, each a name (``problem_of`` says why not, or ``None``) given
    once; every problem at once, each naming its place."""
    problems = Problems()
    first: dict[str, int] = {}
    for index, entry in enumerate(values):
        problem = problem_of(entry)
        if problem is not None:
            problems.add(DefinitionError(f"{path}[{index}]", problem))
        elif entry in first:
            problems.add(DefinitionError(f"{path}[{index}]", f"{entry!r} is named twice (also {path}[{first[entry]}])"))
        else:
            first[entry] = index
    problems.raise_any()
    return tuple(first)


def json_field(value: Any, path: str) -> None:
    limits.check_json(value, path, DefinitionError)
