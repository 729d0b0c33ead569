"""Schedule definitions: validation of the contract's JSON shape into typed, immutable values.

Validation is complete before anything is stored, and every error names the field and the reason.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from celeryapp.cron import CronError, CronExpression
from celeryapp.errors import DefinitionError
from models.states import Overlap

#: Schedule names end up in Redis keys, CLI arguments and metric labels: keep them plain.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
DEFAULT_RETRY_DELAY_S = 60.0
DEFAULT_MAX_ATTEMPTS = 3
MAX_ATTEMPTS_LIMIT = 100
#: Largest payload/args/kwargs accepted, serialized, so a definition cannot bloat every message.
MAX_JSON_BYTES = 64 * 1024

SCHEDULE_FIELDS = frozenset(
    {
        "name",
        "cron",
        "every",
        "timezone",
        "enabled",
        "overlap",
        "max_retries",
        "retry_delay",
        "total_repeats",
        "timeout",
        "payload",
        "steps",
    }
)
STEP_FIELDS = frozenset({"name", "task", "args", "kwargs", "continue_on_failure", "timeout", "queue", "max_attempts"})


@dataclass(frozen=True)
class StepSpec:
    name: str
    task: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    continue_on_failure: bool = False
    timeout_s: float | None = None
    queue: str | None = None
    max_attempts: int = DEFAULT_MAX_ATTEMPTS

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "task": self.task}
        if self.args:
            out["args"] = list(self.args)
        if self.kwargs:
            out["kwargs"] = dict(self.kwargs)
        if self.continue_on_failure:
            out["continue_on_failure"] = True
        if self.timeout_s is not None:
            out["timeout"] = _number_out(self.timeout_s)
        if self.queue is not None:
            out["queue"] = self.queue
        if self.max_attempts != DEFAULT_MAX_ATTEMPTS:
            out["max_attempts"] = self.max_attempts
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> StepSpec:
        """Rebuild from :meth:`to_json` output (already validated, e.g. an execution's plan)."""
        return cls(
            name=raw["name"],
            task=raw["task"],
            args=tuple(raw.get("args", ())),
            kwargs=dict(raw.get("kwargs", {})),
            continue_on_failure=bool(raw.get("continue_on_failure", False)),
            timeout_s=raw.get("timeout"),
            queue=raw.get("queue"),
            max_attempts=int(raw.get("max_attempts", DEFAULT_MAX_ATTEMPTS)),
        )


@dataclass(frozen=True)
class ScheduleDefinition:
    name: str
    groups: tuple[tuple[StepSpec, ...], ...]
    #: Per group, whether it was written as a list (kept so the definition reads back as written).
    group_is_list: tuple[bool, ...]
    cron: str | None = None
    every_s: float | None = None
    timezone: str = "UTC"
    enabled: bool = True
    overlap: Overlap = Overlap.SKIP
    max_retries: int = 0
    retry_delay_s: float = DEFAULT_RETRY_DELAY_S
    total_repeats: int = 0
    timeout_s: float | None = None
    payload: Mapping[str, Any] = field(default_factory=dict)

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    @property
    def retry_base_s(self) -> float:
        """Base of the retry backoff: the interval for ``every`` schedules, else ``retry_delay``."""
        return self.every_s if self.every_s is not None else self.retry_delay_s

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.cron is not None:
            out["cron"] = self.cron
        else:
            out["every"] = _number_out(self.every_s)
        out.update(
            timezone=self.timezone,
            enabled=self.enabled,
            overlap=self.overlap.value,
            max_retries=self.max_retries,
            retry_delay=_number_out(self.retry_delay_s),
            total_repeats=self.total_repeats,
            timeout=_number_out(self.timeout_s),
            payload=dict(self.payload),
            steps=[
                [s.to_json() for s in group] if is_list else group[0].to_json()
                for group, is_list in zip(self.groups, self.group_is_list, strict=True)
            ],
        )
        return out

    def plan(self) -> list[list[dict[str, Any]]]:
        """The step groups as stored on an execution."""
        return [[s.to_json() for s in group] for group in self.groups]


def _number_out(value: float | None) -> float | int | None:
    if value is None:
        return None
    return int(value) if float(value).is_integer() else value


# --- validation -------------------------------------------------------------------------------


def _require_mapping(value: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise DefinitionError(path, f"must be an object, got {_type_name(value)}")
    return value


def _type_name(value: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), type(value).__name__
    )


def _refuse_unknown(raw: Mapping[str, Any], allowed: frozenset[str], path: str) -> None:
    unknown = sorted(str(k) for k in raw if k not in allowed)
    if unknown:
        where = f"{path}." if path else ""
        raise DefinitionError(f"{where}{unknown[0]}", f"unknown field (allowed: {', '.join(sorted(allowed))})")


def _string(raw: Mapping[str, Any], key: str, path: str, *, required: bool = False) -> str | None:
    value = raw.get(key)
    if value is None:
        if required:
            raise DefinitionError(path, "is required")
        return None
    if not isinstance(value, str) or not value.strip():
        raise DefinitionError(path, f"must be a non-empty string, got {_type_name(value)}")
    return value


def _bool(raw: Mapping[str, Any], key: str, path: str, default: bool) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise DefinitionError(path, f"must be true or false, got {_type_name(value)}")
    return value


def _int(raw: Mapping[str, Any], key: str, path: str, default: int, *, low: int, high: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise DefinitionError(path, f"must be an integer, got {_type_name(value)}")
    if not low <= value <= high:
        raise DefinitionError(path, f"must be between {low} and {high}, got {value}")
    return value


def _seconds(raw: Mapping[str, Any], key: str, path: str, default: float | None) -> float | None:
    value = raw.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise DefinitionError(path, f"must be a number of seconds, got {_type_name(value)}")
    if value <= 0:
        raise DefinitionError(path, f"must be greater than 0, got {value}")
    return float(value)


def _json_value(value: Any, path: str) -> None:
    try:
        size = len(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise DefinitionError(path, f"must be plain JSON ({exc})") from None
    if size > MAX_JSON_BYTES:
        raise DefinitionError(path, f"is {size} bytes of JSON, more than {MAX_JSON_BYTES}")


def _parse_step(raw: Any, path: str, known_task: Callable[[str], bool] | None) -> StepSpec:
    raw = _require_mapping(raw, path)
    _refuse_unknown(raw, STEP_FIELDS, path)
    name = _string(raw, "name", f"{path}.name", required=True)
    task = _string(raw, "task", f"{path}.task", required=True)
    assert name is not None and task is not None
    if len(name) > 200:
        raise DefinitionError(f"{path}.name", "must be at most 200 characters")
    if known_task is not None and not known_task(task):
        raise DefinitionError(f"{path}.task", f"task {task!r} is not registered in the worker")
    args = raw.get("args", [])
    if not isinstance(args, list):
        raise DefinitionError(f"{path}.args", f"must be a list, got {_type_name(args)}")
    _json_value(args, f"{path}.args")
    kwargs = raw.get("kwargs", {})
    if not isinstance(kwargs, Mapping):
        raise DefinitionError(f"{path}.kwargs", f"must be an object, got {_type_name(kwargs)}")
    _json_value(kwargs, f"{path}.kwargs")
    return StepSpec(
        name=name,
        task=task,
        args=tuple(args),
        kwargs=dict(kwargs),
        continue_on_failure=_bool(raw, "continue_on_failure", f"{path}.continue_on_failure", False),
        timeout_s=_seconds(raw, "timeout", f"{path}.timeout", None),
        queue=_string(raw, "queue", f"{path}.queue"),
        max_attempts=_int(
            raw, "max_attempts", f"{path}.max_attempts", DEFAULT_MAX_ATTEMPTS, low=1, high=MAX_ATTEMPTS_LIMIT
        ),
    )


def _parse_groups(
    raw: Any, known_task: Callable[[str], bool] | None
) -> tuple[tuple[tuple[StepSpec, ...], ...], tuple[bool, ...]]:
    if not isinstance(raw, list) or not raw:
        raise DefinitionError("steps", "must be a non-empty list of step groups")
    groups: list[tuple[StepSpec, ...]] = []
    is_list: list[bool] = []
    seen: dict[str, str] = {}
    for index, group in enumerate(raw):
        path = f"steps[{index}]"
        if isinstance(group, list):
            if not group:
                raise DefinitionError(path, "a parallel group must hold at least one step")
            steps = tuple(_parse_step(s, f"{path}[{i}]", known_task) for i, s in enumerate(group))
            is_list.append(True)
        else:
            steps = (_parse_step(group, path, known_task),)
            is_list.append(False)
        for i, step in enumerate(steps):
            where = f"{path}[{i}].name" if is_list[-1] else f"{path}.name"
            if step.name in seen:
                raise DefinitionError(where, f"step name {step.name!r} is already used by {seen[step.name]}")
            seen[step.name] = where.removesuffix(".name")
        groups.append(steps)
    return tuple(groups), tuple(is_list)


def parse_definition(
    raw: Any, *, known_task: Callable[[str], bool] | None = None, now: datetime | None = None
) -> ScheduleDefinition:
    """Validate a definition object; raise :class:`DefinitionError` naming the first bad field.

    ``known_task`` tells whether a task name is registered; ``None`` skips that check.
    """
    raw = _require_mapping(raw, "definition")
    _refuse_unknown(raw, SCHEDULE_FIELDS, "")
    name = _string(raw, "name", "name", required=True)
    assert name is not None
    if not NAME_PATTERN.match(name):
        raise DefinitionError(
            "name",
            "must start with a letter or digit and hold only letters, digits, '.', '_' and '-' "
            "(at most 200 characters)",
        )
    timezone = _string(raw, "timezone", "timezone") or "UTC"
    try:
        zone = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise DefinitionError("timezone", f"{timezone!r} is not an IANA time zone name") from None
    cron = raw.get("cron")
    every = raw.get("every")
    if (cron is None) == (every is None):
        raise DefinitionError("cron", "exactly one of 'cron' and 'every' is required")
    every_s: float | None = None
    if cron is not None:
        if not isinstance(cron, str):
            raise DefinitionError("cron", f"must be a string, got {_type_name(cron)}")
        try:
            expression = CronExpression.parse(cron)
            expression.next_after(now or datetime.now(UTC), zone)
        except CronError as exc:
            raise DefinitionError("cron", str(exc)) from None
        cron = expression.text
    else:
        every_s = _seconds(raw, "every", "every", None)
    overlap_raw = raw.get("overlap", Overlap.SKIP.value)
    try:
        overlap = Overlap(overlap_raw)
    except ValueError:
        choices = ", ".join(o.value for o in Overlap)
        raise DefinitionError("overlap", f"must be one of {choices}, got {overlap_raw!r}") from None
    payload = raw.get("payload", {})
    if payload is None:
        payload = {}
    if not isinstance(payload, Mapping):
        raise DefinitionError("payload", f"must be an object, got {_type_name(payload)}")
    _json_value(payload, "payload")
    groups, group_is_list = _parse_groups(raw.get("steps"), known_task)
    return ScheduleDefinition(
        name=name,
        groups=groups,
        group_is_list=group_is_list,
        cron=cron,
        every_s=every_s,
        timezone=timezone,
        enabled=_bool(raw, "enabled", "enabled", True),
        overlap=overlap,
        max_retries=_int(raw, "max_retries", "max_retries", 0, low=0, high=1000),
        retry_delay_s=_seconds(raw, "retry_delay", "retry_delay", DEFAULT_RETRY_DELAY_S) or DEFAULT_RETRY_DELAY_S,
        total_repeats=_int(raw, "total_repeats", "total_repeats", 0, low=0, high=10**9),
        timeout_s=_seconds(raw, "timeout", "timeout", None),
        payload=dict(payload),
    )


def parse_definitions(
    items: Sequence[Any], *, known_task: Callable[[str], bool] | None = None
) -> list[ScheduleDefinition]:
    """Validate a list of definitions (a schedule file); errors say which schedule is wrong."""
    parsed: list[ScheduleDefinition] = []
    names: set[str] = set()
    for index, raw in enumerate(items):
        label = raw.get("name") if isinstance(raw, Mapping) else None
        where = f"schedules[{index}]" + (f" ({label})" if isinstance(label, str) else "")
        try:
            definition = parse_definition(raw, known_task=known_task)
        except DefinitionError as exc:
            raise DefinitionError(f"{where}.{exc.field}", exc.reason) from None
        if definition.name in names:
            raise DefinitionError(f"{where}.name", f"schedule {definition.name!r} appears twice")
        names.add(definition.name)
        parsed.append(definition)
    return parsed
