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
from celeryapp.keys import CONTROL_QUEUES
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
COMMON_STEP_FIELDS = frozenset({"name", "kind", "continue_on_failure", "timeout", "queue", "max_attempts"})
#: Fields of each step kind, and the built-in task that runs the non-task kinds.
KIND_FIELDS = {
    "task": frozenset({"task", "args", "kwargs"}),
    "executable": frozenset({"argv", "cwd", "env"}),
    "sql": frozenset({"script", "database_env"}),
}
KIND_TASKS = {"executable": "chordbeat.steps.executable", "sql": "chordbeat.steps.sql"}
KIND_OF_TASK = {task: kind for kind, task in KIND_TASKS.items()}
#: Environment variable names (executable ``env`` keys, a sql step's ``database_env``).
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class StepSpec:
    """One step. ``executable`` and ``sql`` steps run a built-in task whose kwargs are their fields."""

    name: str
    task: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    continue_on_failure: bool = False
    timeout_s: float | None = None
    queue: str | None = None
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    kind: str = "task"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.kind != "task":
            out["kind"] = self.kind
            out.update(self.kwargs)
        else:
            out["task"] = self.task
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
        kind = raw.get("kind", "task")
        if kind == "task":
            task, args, kwargs = raw["task"], tuple(raw.get("args", ())), dict(raw.get("kwargs", {}))
        else:
            task, args, kwargs = KIND_TASKS[kind], (), {k: raw[k] for k in KIND_FIELDS[kind] if k in raw}
        return cls(
            name=raw["name"],
            task=task,
            kind=kind,
            args=args,
            kwargs=kwargs,
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
    kind = raw.get("kind", "task")
    if kind not in KIND_FIELDS:
        raise DefinitionError(f"{path}.kind", f"must be one of {', '.join(KIND_FIELDS)}, got {kind!r}")
    _refuse_unknown(raw, COMMON_STEP_FIELDS | KIND_FIELDS[kind], path)
    name = _string(raw, "name", f"{path}.name", required=True)
    assert name is not None
    if len(name) > 200:
        raise DefinitionError(f"{path}.name", "must be at most 200 characters")
    task, args, kwargs = _parse_kind(raw, kind, path, known_task)
    queue = _string(raw, "queue", f"{path}.queue")
    if queue in CONTROL_QUEUES:
        raise DefinitionError(f"{path}.queue", f"{queue!r} is a control queue; steps run on their own queues")
    return StepSpec(
        name=name,
        task=task,
        kind=kind,
        args=args,
        kwargs=kwargs,
        continue_on_failure=_bool(raw, "continue_on_failure", f"{path}.continue_on_failure", False),
        timeout_s=_seconds(raw, "timeout", f"{path}.timeout", None),
        queue=queue,
        max_attempts=_int(
            raw, "max_attempts", f"{path}.max_attempts", DEFAULT_MAX_ATTEMPTS, low=1, high=MAX_ATTEMPTS_LIMIT
        ),
    )


def _parse_kind(
    raw: Mapping[str, Any], kind: str, path: str, known_task: Callable[[str], bool] | None
) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    """The task, args and kwargs a step of this kind runs."""
    if kind in KIND_TASKS and known_task is not None and not known_task(KIND_TASKS[kind]):
        raise DefinitionError(f"{path}.kind", f"{kind} steps are not enabled on the workers (CHORDBEAT_STEP_KINDS)")
    if kind == "executable":
        argv = raw.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv) or not argv[0]:
            raise DefinitionError(f"{path}.argv", "must be a non-empty list of strings (program first)")
        kwargs: dict[str, Any] = {"argv": list(argv)}
        if raw.get("cwd") is not None:
            kwargs["cwd"] = _string(raw, "cwd", f"{path}.cwd")
        env = raw.get("env")
        if env is not None:
            if not isinstance(env, Mapping) or not all(
                isinstance(k, str) and ENV_NAME.match(k) and isinstance(v, str) for k, v in env.items()
            ):
                raise DefinitionError(f"{path}.env", "must be an object of variable names to string values")
            kwargs["env"] = dict(env)
        return KIND_TASKS[kind], (), kwargs
    if kind == "sql":
        script = _string(raw, "script", f"{path}.script", required=True)
        variable = _string(raw, "database_env", f"{path}.database_env", required=True)
        if variable is None or not ENV_NAME.match(variable):
            raise DefinitionError(f"{path}.database_env", "must name an environment variable holding the URL")
        return KIND_TASKS[kind], (), {"script": script, "database_env": variable}
    task = _string(raw, "task", f"{path}.task", required=True)
    assert task is not None
    if task in KIND_OF_TASK:
        raise DefinitionError(f"{path}.task", f'use "kind": "{KIND_OF_TASK[task]}" instead of the task {task!r}')
    if known_task is not None and not known_task(task):
        raise DefinitionError(f"{path}.task", f"task {task!r} is not registered in the worker")
    args = raw.get("args", [])
    if not isinstance(args, list):
        raise DefinitionError(f"{path}.args", f"must be a list, got {_type_name(args)}")
    _json_value(args, f"{path}.args")
    task_kwargs = raw.get("kwargs", {})
    if not isinstance(task_kwargs, Mapping):
        raise DefinitionError(f"{path}.kwargs", f"must be an object, got {_type_name(task_kwargs)}")
    _json_value(task_kwargs, f"{path}.kwargs")
    return task, tuple(args), dict(task_kwargs)


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
