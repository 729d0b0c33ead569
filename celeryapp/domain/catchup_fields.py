"""A definition's ``catchup`` read from untrusted JSON, every problem at once.

``{"policy": "all", "window": 3600, "max_runs": 5}``; ``window`` and ``max_runs`` belong to ``all``
alone (a ``latest`` or ``none`` schedule makes up nothing, so a bound there would be a mistake).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celeryapp.domain.catchup import DEFAULT_MAX_RUNS, DEFAULT_WINDOW_S, CatchupPolicy, CatchupRules
from celeryapp.domain.fields import int_field, refuse_unknown, require_mapping, seconds_field
from celeryapp.domain.limits import DAY_S, short_repr, type_name
from celeryapp.domain.problems import Problems
from celeryapp.errors import DefinitionError

CATCHUP_FIELDS = frozenset({"policy", "window", "max_runs"})
#: ``all`` looks back at most a year (and a day); at least a second.
MIN_WINDOW_S = 1.0
MAX_WINDOW_S = 366.0 * DAY_S
#: Make-up runs one catch-up starts at most: each is a run, and a slot record.
MAX_MAKE_UP_RUNS = 1000


def parse_catchup_field(raw: Mapping[str, Any]) -> CatchupRules | None:
    """The definition's ``catchup`` (``None`` when absent or null: ``latest``)."""
    value = raw.get("catchup")
    if value is None:
        return None
    catchup = require_mapping(value, "catchup")
    problems = Problems()
    problems.check(refuse_unknown, catchup, CATCHUP_FIELDS, "catchup")
    policy = problems.check(_policy, catchup.get("policy"))
    # A null bound is one not given, as a null catchup is none.
    given = {key: value for key, value in catchup.items() if value is not None}
    if policy is not None and policy is not CatchupPolicy.ALL:
        for key in ("window", "max_runs"):
            if key in given:
                problems.add(
                    DefinitionError(f"catchup.{key}", f"is for policy 'all' only (policy is {policy.value!r})")
                )
        problems.raise_any()
        return CatchupRules(policy)
    # With no valid policy the bounds are still checked: every mistake is reported at once.
    window_s = problems.check(
        seconds_field, given, "window", "catchup.window", DEFAULT_WINDOW_S, low=MIN_WINDOW_S, high=MAX_WINDOW_S
    )
    max_runs = problems.check(
        int_field, given, "max_runs", "catchup.max_runs", DEFAULT_MAX_RUNS, low=1, high=MAX_MAKE_UP_RUNS
    )
    problems.raise_any()
    assert policy is not None and window_s is not None and max_runs is not None
    return CatchupRules(policy, window_s, max_runs)


def _policy(value: Any) -> CatchupPolicy:
    path = "catchup.policy"
    choices = ", ".join(choice.value for choice in CatchupPolicy)
    if value is None:
        raise DefinitionError(path, f"is required: one of {choices} (leave catchup out for latest)")
    if not isinstance(value, str) or value not in {choice.value for choice in CatchupPolicy}:
        shown = short_repr(value) if isinstance(value, str) else type_name(value)
        raise DefinitionError(path, f"must be one of {choices}, got {shown}")
    return CatchupPolicy(value)
