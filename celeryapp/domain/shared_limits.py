"""Shared limits as definitions: named slot counts many schedules' steps share, read from hostile
JSON with every mistake reported at once.

Not :mod:`celeryapp.domain.limits`, which holds the input *bounds* of everything a caller sends. A
shared limit is ``{"name": "warehouse", "slots": 3, "rate": "60/min", "key": "{payload.customer}",
"per_key_slots": 1, "on_full": "queue", "max_wait": 600}`` (docs/limits.md); a step or a schedule
names the limits it ``uses``. Which waiter a free slot goes to is :mod:`limit_admission`'s.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from celeryapp.domain import limits
from celeryapp.domain.definition import (
    INVISIBLE_CATEGORIES,
    NAME_PATTERN,
    LimitUse,
    ScheduleDefinition,
    StepSpec,
    combined_uses,
)
from celeryapp.domain.fields import refuse_unknown, require_mapping, seconds_field, string_field
from celeryapp.domain.limits import short_repr, type_name
from celeryapp.domain.problems import Problems
from celeryapp.errors import DefinitionError, InvalidArgument

LIMIT_FIELDS = frozenset({"name", "slots", "rate", "key", "per_key_slots", "on_full", "max_wait"})
#: Slots of one limit: a count of concurrent holders, never a pool of memory.
MAX_SLOTS = 10_000
#: ``N`` of a rate ``N/period``: starts per period (the bucket's burst).
MAX_RATE_COUNT = 1_000_000
#: A rate as written (``"60/min"``), and a key template as written.
MAX_RATE_CHARS = 40
MAX_TEMPLATE_CHARS = 200
#: Placeholders of one key template.
MAX_PLACEHOLDERS = 8
#: A rendered key: stored on every hold and waiter, shown on the Limits page.
MAX_KEY_CHARS = 200
#: ``max_wait``: how long the oldest waiter may wait before a ``starved`` alert.
MIN_MAX_WAIT_S = 1.0
MAX_MAX_WAIT_S = limits.MAX_TIMEOUT_S
#: Limits one step (or one schedule) may use: each is a row locked to start it.
MAX_USES = 16
USE_FIELDS = frozenset({"limit", "slots"})
#: A limit definition, serialized (a few hundred bytes when written sensibly).
MAX_DEFINITION_BYTES = 4 * 1024

#: A rate's period words and their seconds.
PERIODS = {
    **dict.fromkeys(("s", "sec", "second", "seconds"), 1.0),
    **dict.fromkeys(("min", "minute", "minutes"), 60.0),
    **dict.fromkeys(("h", "hour", "hours"), 3600.0),
    **dict.fromkeys(("d", "day", "days"), float(limits.DAY_S)),
}
#: ``N/period``, ASCII digits only (``\d`` would take other scripts' digits, which ``int()`` reads).
_RATE_PATTERN = re.compile(r"([0-9]{1,7})\s*/\s*([a-z]{1,12})")
#: A placeholder of a key template; what is inside is checked by :func:`_placeholder`.
_PLACEHOLDER_PATTERN = re.compile(r"\{([^{}]*)\}")
#: ``payload.<field>``: a field a JSON object may have, as schedule names are written.
_PAYLOAD_FIELD_PATTERN = re.compile(r"payload\.([A-Za-z0-9_][A-Za-z0-9_-]{0,63})")


class OnFull(StrEnum):
    """What a step does when a limit it uses has no room (the limit's ``on_full``)."""

    #: It waits, a database row holding no worker, until every limit it uses has room.
    QUEUE = "queue"
    #: It does not run; the step is recorded skipped.
    SKIP = "skip"


@dataclass(frozen=True)
class Rate:
    """A token bucket: ``count`` starts per ``period_s``, up to ``count`` at once after a quiet spell."""

    count: int
    period_s: float
    text: str

    @property
    def per_s(self) -> float:
        return self.count / self.period_s


@dataclass(frozen=True)
class KeyTemplate:
    """``{payload.customer}-{step}``: literal text and placeholders, rendered per step run."""

    text: str
    #: The placeholders in order: ``schedule``, ``step`` or ``payload.<field>``.
    fields: tuple[str, ...]

    def render(self, *, payload: Mapping[str, Any], schedule: str, step: str) -> str:
        """The key of one step run. A payload field that is missing, not a string or an integer,
        or a key empty or over :data:`MAX_KEY_CHARS`, is refused naming the field."""
        values = {"schedule": schedule, "step": step}
        for field in self.fields:
            if field.startswith("payload."):
                values[field] = _payload_value(payload, field)
        key = _PLACEHOLDER_PATTERN.sub(lambda match: values[match.group(1)], self.text)
        blame = next((field for field in self.fields if field.startswith("payload.")), "key")
        if not key.strip():
            raise InvalidArgument(blame, f"makes an empty key of {self.text!r}")
        if len(key) > MAX_KEY_CHARS:
            raise InvalidArgument(
                blame, f"makes a key of {len(key)} characters from {self.text!r}, more than {MAX_KEY_CHARS}"
            )
        return key


def _payload_value(payload: Mapping[str, Any], field: str) -> str:
    name = field.removeprefix("payload.")
    if name not in payload:
        raise InvalidArgument(field, "is needed by a limit's key but the run's payload has no such field")
    value = payload[name]
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise InvalidArgument(field, f"must be a string or an integer to make a limit's key, got {type_name(value)}")
    text = str(value)
    if any(unicodedata.category(char) in INVISIBLE_CATEGORIES for char in text):
        raise InvalidArgument(field, "must not hold control or invisible characters to make a limit's key")
    if len(text) > MAX_KEY_CHARS:
        raise InvalidArgument(field, f"is {len(text)} characters, more than a limit's key may be ({MAX_KEY_CHARS})")
    return text


@dataclass(frozen=True)
class LimitDefinition:
    name: str
    slots: int
    rate: Rate | None = None
    key: KeyTemplate | None = None
    #: Slots one key may hold at once (only with ``key``); ``None``: as many as the limit has.
    per_key_slots: int | None = None
    on_full: OnFull = OnFull.QUEUE
    max_wait_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "slots": self.slots,
            "rate": None if self.rate is None else self.rate.text,
            "key": None if self.key is None else self.key.text,
            "per_key_slots": self.per_key_slots,
            "on_full": self.on_full.value,
            "max_wait": None if self.max_wait_s is None else _number_out(self.max_wait_s),
        }


def parse_limit(raw: Any) -> LimitDefinition:
    """Validate a limit definition; raise one :class:`DefinitionError` naming every bad field."""
    raw = require_mapping(raw, "definition")
    _check_size(raw)
    problems = Problems()
    problems.check(refuse_unknown, raw, LIMIT_FIELDS, "")
    name = problems.check(limit_name, raw.get("name"), "name")
    slots = problems.check(_slots, raw.get("slots"), "slots")
    rate = problems.check(parse_rate, raw.get("rate"))
    key = problems.check(parse_key_template, raw.get("key"))
    per_key = problems.check(_per_key_slots, raw, has_key=raw.get("key") is not None, slots=slots)
    on_full = problems.check(_on_full, raw.get("on_full"))
    max_wait_s = problems.check(
        seconds_field, raw, "max_wait", "max_wait", None, low=MIN_MAX_WAIT_S, high=MAX_MAX_WAIT_S
    )
    problems.raise_any()
    assert name is not None and slots is not None and on_full is not None
    return LimitDefinition(name, slots, rate, key, per_key, on_full, max_wait_s)


def _check_size(raw: Mapping[str, Any]) -> None:
    try:
        size = limits.json_size(raw)
    except (RecursionError, ValueError):
        raise DefinitionError("definition", "must be plain JSON of at most 32 levels") from None
    if size > MAX_DEFINITION_BYTES:
        raise DefinitionError("definition", f"is {size} bytes of JSON, more than {MAX_DEFINITION_BYTES}")


def _slots(value: Any, path: str) -> int:
    if value is None:
        raise DefinitionError(path, f"is required: an integer from 1 to {MAX_SLOTS}")
    return limits.check_int(value, path, DefinitionError, low=1, high=MAX_SLOTS)


def limit_name(value: Any, path: str) -> str:
    """A limit's name, written as schedule names are (ASCII: no look-alike letters)."""
    if value is None:
        raise DefinitionError(path, "is required")
    if not isinstance(value, str):
        raise DefinitionError(path, f"must be a limit's name (a string), got {type_name(value)}")
    if not NAME_PATTERN.fullmatch(value):
        raise DefinitionError(
            path,
            "must start with a letter or digit and hold only ASCII letters, digits, '.', '_' and '-' "
            f"(at most {limits.MAX_NAME_CHARS} characters), got {short_repr(value)}",
        )
    return value


def parse_rate(value: Any) -> Rate | None:
    """``"60/min"`` as a token bucket (``None`` when absent or null)."""
    if value is None:
        return None
    periods = "s, min, h, d (or second, minute, hour, day)"
    if not isinstance(value, str):
        raise DefinitionError("rate", f"must be a string written N/period, got {type_name(value)}")
    if len(value) > MAX_RATE_CHARS:
        raise DefinitionError("rate", f"must be at most {MAX_RATE_CHARS} characters, got {len(value)}")
    match = _RATE_PATTERN.fullmatch(value.strip())
    if match is None:
        raise DefinitionError(
            "rate", f"must be written N/period (60/min), period one of {periods}, got {short_repr(value)}"
        )
    count, period = int(match.group(1)), match.group(2)
    if period not in PERIODS:
        raise DefinitionError("rate", f"{period!r} is not a period: one of {periods}")
    if not 1 <= count <= MAX_RATE_COUNT:
        raise DefinitionError("rate", f"N must be between 1 and {MAX_RATE_COUNT}, got {count}")
    return Rate(count, PERIODS[period], f"{count}/{period}")


def parse_key_template(value: Any) -> KeyTemplate | None:
    """``"{payload.customer}"`` (``None`` when absent or null): placeholders over ``payload.<field>``,
    ``schedule`` and ``step`` only, at least one of them."""
    if value is None:
        return None
    string_field({"key": value}, "key", "key")
    assert isinstance(value, str)
    if len(value) > MAX_TEMPLATE_CHARS:
        raise DefinitionError("key", f"must be at most {MAX_TEMPLATE_CHARS} characters, got {len(value)}")
    if any(unicodedata.category(char) in INVISIBLE_CATEGORIES for char in value):
        raise DefinitionError("key", "must not hold control or invisible characters")
    fields = tuple(match.group(1) for match in _PLACEHOLDER_PATTERN.finditer(value))
    if "{" in _PLACEHOLDER_PATTERN.sub("", value) or "}" in _PLACEHOLDER_PATTERN.sub("", value):
        raise DefinitionError("key", f"has a '{{' or '}}' that opens or closes no placeholder: {short_repr(value)}")
    if not fields:
        raise DefinitionError("key", "must hold a placeholder: {payload.<field>}, {schedule} or {step}")
    if len(fields) > MAX_PLACEHOLDERS:
        raise DefinitionError("key", f"must hold at most {MAX_PLACEHOLDERS} placeholders, got {len(fields)}")
    unknown = [field for field in fields if not _placeholder(field)]
    if unknown:
        raise DefinitionError(
            "key",
            f"{{{short_repr(unknown[0])[1:-1]}}} is not a placeholder: {{payload.<field>}}, {{schedule}} or {{step}}",
        )
    return KeyTemplate(value, fields)


def _placeholder(field: str) -> bool:
    return field in ("schedule", "step") or _PAYLOAD_FIELD_PATTERN.fullmatch(field) is not None


def _per_key_slots(raw: Mapping[str, Any], *, has_key: bool, slots: int | None) -> int | None:
    if raw.get("per_key_slots") is None:
        return None
    if not has_key:
        raise DefinitionError("per_key_slots", "is for a limit with a key only (give key, or leave per_key_slots out)")
    return limits.check_int(raw["per_key_slots"], "per_key_slots", DefinitionError, low=1, high=slots or MAX_SLOTS)


def _on_full(value: Any) -> OnFull:
    if value is None:
        return OnFull.QUEUE
    choices = ", ".join(choice.value for choice in OnFull)
    if not isinstance(value, str) or value not in {choice.value for choice in OnFull}:
        shown = short_repr(value) if isinstance(value, str) else type_name(value)
        raise DefinitionError("on_full", f"must be one of {choices}, got {shown}")
    return OnFull(value)


def parse_uses(value: Any, path: str) -> tuple[LimitUse, ...]:
    """A step's or schedule's ``uses``: ``["warehouse", {"limit": "erp", "slots": 2}]``, each limit
    named once; every problem at once, each naming its place."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise DefinitionError(path, f"must be a list of limit names, got {type_name(value)}")
    if len(value) > MAX_USES:
        raise DefinitionError(path, f"must name at most {MAX_USES} limits, got {len(value)}")
    problems = Problems()
    uses: list[LimitUse] = []
    seen: dict[str, int] = {}
    for index, entry in enumerate(value):
        use = problems.check(_use, entry, f"{path}[{index}]")
        if use is None:
            continue
        if use.limit in seen:
            problems.add(
                DefinitionError(f"{path}[{index}]", f"{use.limit!r} is named twice (also {path}[{seen[use.limit]}])")
            )
            continue
        seen[use.limit] = index
        uses.append(use)
    problems.raise_any()
    return tuple(uses)


def _use(entry: Any, path: str) -> LimitUse:
    if isinstance(entry, str) or entry is None:
        return LimitUse(limit_name(entry, path))
    if not isinstance(entry, Mapping):
        raise DefinitionError(path, f"must be a limit's name or {{limit, slots}}, got {type_name(entry)}")
    problems = Problems()
    problems.check(refuse_unknown, entry, USE_FIELDS, path)
    name = problems.check(limit_name, entry.get("limit"), f"{path}.limit")
    slots = problems.check(_slots, entry.get("slots", 1), f"{path}.slots")
    problems.raise_any()
    assert name is not None and slots is not None
    return LimitUse(name, slots)


def check_uses_known(uses: tuple[LimitUse, ...], known: Mapping[str, LimitDefinition], path: str) -> None:
    """Every limit ``uses`` names is defined, and has the slots asked for: a use that could never
    be admitted would wait for ever (Airflow's pools failed every such task, #9316)."""
    problems = Problems()
    for index, use in enumerate(uses):
        limit = known.get(use.limit)
        if limit is None:
            problems.add(DefinitionError(f"{path}[{index}]", f"{use.limit!r} is not a defined limit"))
        elif use.slots > (limit.per_key_slots or limit.slots):
            what = "per key" if limit.per_key_slots else "in all"
            room = limit.per_key_slots or limit.slots
            problems.add(
                DefinitionError(
                    f"{path}[{index}].slots", f"asks for {use.slots} slots of {use.limit!r}, which has {room} {what}"
                )
            )
    problems.raise_any()


def _number_out(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value


def check_definition_uses(definition: ScheduleDefinition, known: Mapping[str, LimitDefinition]) -> None:
    """Every limit a schedule's definition uses (its own ``uses`` and each step's) is defined and
    has the slots asked for; every problem at once, each naming its place (``steps[0].uses[1]``)."""
    problems = Problems()
    problems.check(check_uses_known, definition.uses, known, "uses")
    for path, step in step_paths(definition):
        problems.check(check_uses_known, step.uses, known, f"{path}.uses")
    problems.raise_any()


def check_combined_uses(definition: ScheduleDefinition) -> None:
    """A step's own ``uses`` with its schedule's name at most :data:`MAX_USES` limits together."""
    problems = Problems()
    for path, step in step_paths(definition):
        combined = combined_uses(definition.uses, step.uses)
        if len(combined) > MAX_USES:
            problems.add(
                DefinitionError(
                    f"{path}.uses",
                    f"names {len(combined)} limits with the schedule's uses, more than {MAX_USES} for one step",
                )
            )
    problems.raise_any()


def step_paths(definition: ScheduleDefinition) -> list[tuple[str, StepSpec]]:
    """Each step with its place as written (``steps[1]``, or ``steps[1][0]`` in a parallel group)."""
    return [
        (f"steps[{index}][{position}]" if is_list else f"steps[{index}]", step)
        for index, (group, is_list) in enumerate(zip(definition.groups, definition.group_is_list, strict=True))
        for position, step in enumerate(group)
    ]
