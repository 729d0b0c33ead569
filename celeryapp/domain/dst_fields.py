"""A definition's ``dst`` read from untrusted JSON, every problem at once.

``{"repeated": "last", "missing": "skip"}``: either key may be left out (that case keeps the
default rule), not both. Only a cron schedule takes it: an ``every`` schedule's slots are anchored
in absolute time, which no change of the clocks moves, so a rule there would change nothing and
is refused rather than silently ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any, TypeVar

from celeryapp.domain.dst_rules import DstRules, Missing, Repeated
from celeryapp.domain.fields import refuse_unknown, require_mapping
from celeryapp.domain.limits import short_repr, type_name
from celeryapp.domain.problems import Problems
from celeryapp.errors import DefinitionError

DST_FIELDS = frozenset({"repeated", "missing"})
_Choice = TypeVar("_Choice", bound=StrEnum)


def parse_dst_field(raw: Mapping[str, Any]) -> DstRules | None:
    """The definition's ``dst`` (``None`` when absent or null: the default rule)."""
    value = raw.get("dst")
    if value is None:
        return None
    dst = require_mapping(value, "dst")
    problems = Problems()
    problems.check(refuse_unknown, dst, DST_FIELDS, "dst")
    repeated = problems.check(_choice, dst.get("repeated"), "dst.repeated", Repeated)
    missing = problems.check(_choice, dst.get("missing"), "dst.missing", Missing)
    if not problems and repeated is None and missing is None:
        problems.add(DefinitionError("dst", "must give repeated or missing (leave dst out for the default rule)"))
    if raw.get("cron") is None and raw.get("every") is not None:
        problems.add(
            DefinitionError(
                "dst",
                "is for cron schedules only: an 'every' schedule counts absolute time, which a change of"
                " the clocks does not move",
            )
        )
    problems.raise_any()
    return DstRules(repeated=repeated, missing=missing)


def _choice(value: Any, path: str, kind: type[_Choice]) -> _Choice | None:
    if value is None:
        return None
    choices = ", ".join(choice.value for choice in kind)
    if not isinstance(value, str) or value not in {choice.value for choice in kind}:
        shown = short_repr(value) if isinstance(value, str) else type_name(value)
        raise DefinitionError(path, f"must be one of {choices}, got {shown}")
    return kind(value)
