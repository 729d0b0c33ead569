"""Schedule definitions from the contract's JSON: every field checked before anything is stored.

Every error names the field and the reason. Every number has a range and every size a cap
(celeryapp/domain/limits.py), and the cadence is computed here once, so nothing stored can fail
later.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from celeryapp.domain import limits
from celeryapp.domain.cadence import Cadence, retry_delay_s
from celeryapp.domain.cron import CronError, CronExpression
from celeryapp.domain.definition import (
    ALL_STEP_FIELDS,
    COMMON_STEP_FIELDS,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_RETRY_DELAY_S,
    INVISIBLE_CATEGORIES,
    KIND_FIELDS,
    KIND_OF_TASK,
    KIND_TASKS,
    MAX_ATTEMPTS_LIMIT,
    MAX_ZONE_CHARS,
    NAME_PATTERN,
    QUEUE_PATTERN,
    SCHEDULE_FIELDS,
    TASK_PATTERN,
    ScheduleDefinition,
    StepKind,
    StepSpec,
)
from celeryapp.domain.limits import MAX_JSON_BYTES, short_repr
from celeryapp.domain.names import CONTROL_QUEUES
from celeryapp.domain.step_policy import StepRules, env_name_refusal
from celeryapp.domain.zones import canonical_zone_problem
from celeryapp.errors import DefinitionError, DefinitionErrors
from models.states import Overlap


def _require_mapping(value: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise DefinitionError(path, f"must be an object, got {_type_name(value)}")
    return value


_type_name = limits.type_name


def _refuse_unknown(raw: Mapping[str, Any], allowed: frozenset[str], path: str) -> None:
    unknown = sorted((k for k in raw if k not in allowed), key=str)
    if unknown:
        where = f"{path}." if path else ""
        first = unknown[0]
        label = first if isinstance(first, str) and NAME_PATTERN.fullmatch(first) else short_repr(first)
        raise DefinitionError(f"{where}{label}", f"unknown field (allowed: {', '.join(sorted(allowed))})")


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
        raise DefinitionError(path, f"must be between {low} and {high}, got {short_repr(value)}")
    return value


def _seconds(
    raw: Mapping[str, Any], key: str, path: str, default: float | None, *, low: float, high: float
) -> float | None:
    value = raw.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DefinitionError(path, f"must be a number of seconds, got {_type_name(value)}")
    # Compared before float(): an int too large for a float is just out of range.
    if isinstance(value, float) and value != value:
        raise DefinitionError(path, "must be a number of seconds, got NaN")
    if not low <= value <= high:
        bounds = f"{limits.seconds_text(low).removesuffix(' seconds')} and {limits.seconds_text(high)}"
        raise DefinitionError(path, f"must be between {bounds}, got {short_repr(value)}")
    return float(value)


def _json_value(value: Any, path: str) -> None:
    limits.check_json(value, path, DefinitionError)


def _step_name(raw: Mapping[str, Any], path: str) -> str:
    """Step names are shown to people: no invisible characters that make look-alikes."""
    name = _string(raw, "name", path, required=True)
    assert name is not None
    if len(name) > limits.MAX_NAME_CHARS:
        raise DefinitionError(path, f"must be at most {limits.MAX_NAME_CHARS} characters, got {len(name)}")
    if name != name.strip():
        raise DefinitionError(path, "must not start or end with white space")
    for char in name:
        category = unicodedata.category(char)
        if category in INVISIBLE_CATEGORIES or (category == "Zs" and char != " "):
            raise DefinitionError(
                path, f"must not hold control, invisible or special space characters (U+{ord(char):04X})"
            )
    if unicodedata.normalize("NFC", name) != name:
        raise DefinitionError(path, "must be in Unicode normal form NFC")
    return name


def _pattern(raw: Mapping[str, Any], key: str, path: str, pattern: re.Pattern[str], what: str) -> str | None:
    value = _string(raw, key, path)
    if value is not None and not pattern.fullmatch(value):
        raise DefinitionError(path, f"{short_repr(value)} is not {what}")
    return value


#: Rules for a definition checked with none given.
_NO_POLICY = StepRules.without_policy()


def _parse_step(raw: Any, path: str, rules: StepRules) -> StepSpec:
    raw = _require_mapping(raw, path)
    raw_kind = raw.get("kind", StepKind.TASK)
    if not isinstance(raw_kind, str) or raw_kind not in KIND_FIELDS:
        choices = ", ".join(k.value for k in StepKind)
        raise DefinitionError(f"{path}.kind", f"must be one of {choices}, got {short_repr(raw_kind)}")
    kind = StepKind(raw_kind)
    _refuse_unknown(raw, COMMON_STEP_FIELDS | KIND_FIELDS[kind], path)
    name = _step_name(raw, f"{path}.name")
    if kind is StepKind.TASK:
        _pattern(raw, "task", f"{path}.task", TASK_PATTERN, "a Celery task name (printable, no spaces)")
    task, args, kwargs = _parse_kind(raw, kind, path, rules)
    queue = _pattern(raw, "queue", f"{path}.queue", QUEUE_PATTERN, "a queue name (letters, digits, '.', '_', '-', ':')")
    if queue in CONTROL_QUEUES:
        raise DefinitionError(f"{path}.queue", f"{queue!r} is a control queue; steps run on their own queues")
    return StepSpec(
        name=name,
        task=task,
        kind=kind,
        args=args,
        kwargs=kwargs,
        continue_on_failure=_bool(raw, "continue_on_failure", f"{path}.continue_on_failure", False),
        timeout_s=_seconds(
            raw, "timeout", f"{path}.timeout", None, low=limits.MIN_TIMEOUT_S, high=limits.MAX_TIMEOUT_S
        ),
        queue=queue,
        max_attempts=_int(
            raw, "max_attempts", f"{path}.max_attempts", DEFAULT_MAX_ATTEMPTS, low=1, high=MAX_ATTEMPTS_LIMIT
        ),
    )


def _parse_kind(
    raw: Mapping[str, Any], kind: StepKind, path: str, rules: StepRules
) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    """The task, args and kwargs a step of this kind runs, if ``rules`` let it run."""
    if kind in KIND_TASKS:
        refusal = rules.spec_refusal(kind, KIND_TASKS[kind])
        if refusal:
            raise DefinitionError(f"{path}.kind", refusal)
    if kind is StepKind.EXECUTABLE:
        return KIND_TASKS[kind], (), _parse_executable(raw, path, rules)
    if kind is StepKind.SQL:
        return KIND_TASKS[kind], (), _parse_sql(raw, path, rules)
    task = _string(raw, "task", f"{path}.task", required=True)
    assert task is not None
    if task in KIND_OF_TASK:
        raise DefinitionError(f"{path}.task", f'use "kind": "{KIND_OF_TASK[task]}" instead of the task {task!r}')
    refusal = rules.task_refusal(task)
    if refusal:
        raise DefinitionError(f"{path}.task", refusal)
    args = raw.get("args", [])
    if not isinstance(args, list):
        raise DefinitionError(f"{path}.args", f"must be a list, got {_type_name(args)}")
    _json_value(args, f"{path}.args")
    task_kwargs = raw.get("kwargs", {})
    if not isinstance(task_kwargs, Mapping):
        raise DefinitionError(f"{path}.kwargs", f"must be an object, got {_type_name(task_kwargs)}")
    _json_value(task_kwargs, f"{path}.kwargs")
    return task, tuple(args), dict(task_kwargs)


def _parse_executable(raw: Mapping[str, Any], path: str, rules: StepRules) -> dict[str, Any]:
    argv = raw.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv) or not argv[0]:
        raise DefinitionError(f"{path}.argv", "must be a non-empty list of strings (program first)")
    if any("\0" in a for a in argv):
        raise DefinitionError(f"{path}.argv", "must not contain NUL characters")
    _json_value(argv, f"{path}.argv")
    refusal = rules.executable_refusal(argv[0])
    if refusal:
        raise DefinitionError(f"{path}.argv", refusal)
    kwargs: dict[str, Any] = {"argv": list(argv)}
    if raw.get("cwd") is not None:
        kwargs["cwd"] = _string(raw, "cwd", f"{path}.cwd")
        if "\0" in kwargs["cwd"]:
            raise DefinitionError(f"{path}.cwd", "must not contain NUL characters")
    env = raw.get("env")
    if env is not None:
        if not isinstance(env, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise DefinitionError(f"{path}.env", "must be an object of variable names to string values")
        for name, value in env.items():
            refusal = env_name_refusal(name)
            if refusal:
                raise DefinitionError(f"{path}.env.{name}", refusal)
            if "\0" in value:
                raise DefinitionError(f"{path}.env.{name}", "must not contain NUL characters")
        _json_value(env, f"{path}.env")
        kwargs["env"] = dict(env)
    return kwargs


def _parse_sql(raw: Mapping[str, Any], path: str, rules: StepRules) -> dict[str, Any]:
    script = _string(raw, "script", f"{path}.script", required=True)
    _json_value(script, f"{path}.script")
    variable = _string(raw, "database_env", f"{path}.database_env", required=True)
    assert script is not None and variable is not None
    refusal = rules.sql_env_refusal(variable)
    if refusal:
        raise DefinitionError(f"{path}.database_env", refusal)
    return {"script": script, "database_env": variable}


def _check_step_counts(raw: Any) -> None:
    """Counted before any step is looked at: starting a run writes one row per step."""
    if not isinstance(raw, list):
        return
    if len(raw) > limits.MAX_GROUPS:
        raise DefinitionError("steps", f"must hold at most {limits.MAX_GROUPS} step groups, got {len(raw)}")
    total = 0
    for index, group in enumerate(raw):
        count = len(group) if isinstance(group, list) else 1
        if count > limits.MAX_GROUP_STEPS:
            raise DefinitionError(
                f"steps[{index}]", f"a parallel group holds at most {limits.MAX_GROUP_STEPS} steps, got {count}"
            )
        total += count
    if total > limits.MAX_STEPS:
        raise DefinitionError("steps", f"must hold at most {limits.MAX_STEPS} steps in all, got {total}")


def _check_size(raw: Mapping[str, Any]) -> None:
    """The whole definition's size, checked before it is walked field by field. When one part is
    over its own cap, the error names that part."""
    try:
        size = limits.json_size(raw)
    except (RecursionError, ValueError):
        return  # the field-by-field checks find and name what is wrong
    if size <= limits.MAX_DEFINITION_BYTES:
        return
    for path, part in _parts(raw):
        try:
            part_size = limits.json_size(part)
        except (RecursionError, ValueError):
            continue
        if part_size > MAX_JSON_BYTES:
            raise DefinitionError(path, f"is {part_size} bytes of JSON, more than {MAX_JSON_BYTES}")
    raise DefinitionError("definition", f"is {size} bytes of JSON, more than {limits.MAX_DEFINITION_BYTES}")


def _parts(raw: Mapping[str, Any]) -> list[tuple[str, Any]]:
    parts: list[tuple[str, Any]] = [(key, raw[key]) for key in sorted(SCHEDULE_FIELDS - {"steps"}) if key in raw]
    steps = raw.get("steps")
    if isinstance(steps, list):
        for index, group in enumerate(steps):
            members = enumerate(group) if isinstance(group, list) else [(None, group)]
            for position, step in members:
                path = f"steps[{index}]" if position is None else f"steps[{index}][{position}]"
                if isinstance(step, Mapping):
                    parts.extend((f"{path}.{key}", step[key]) for key in sorted(ALL_STEP_FIELDS) if key in step)
    return parts


def _parse_groups(raw: Any, rules: StepRules) -> tuple[tuple[tuple[StepSpec, ...], ...], tuple[bool, ...]]:
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
            steps = tuple(_parse_step(s, f"{path}[{i}]", rules) for i, s in enumerate(group))
            is_list.append(True)
        else:
            steps = (_parse_step(group, path, rules),)
            is_list.append(False)
        for i, step in enumerate(steps):
            where = f"{path}[{i}].name" if is_list[-1] else f"{path}.name"
            if step.name in seen:
                raise DefinitionError(where, f"step name {step.name!r} is already used by {seen[step.name]}")
            seen[step.name] = where.removesuffix(".name")
        groups.append(steps)
    return tuple(groups), tuple(is_list)


def _schedule_name(raw: Mapping[str, Any]) -> str:
    name = _string(raw, "name", "name", required=True)
    assert name is not None
    if not NAME_PATTERN.fullmatch(name):
        raise DefinitionError(
            "name",
            "must start with a letter or digit and hold only letters, digits, '.', '_' and '-' "
            f"(at most {limits.MAX_NAME_CHARS} characters), got {short_repr(name)}",
        )
    return name


def _timezone(raw: Mapping[str, Any]) -> tuple[str, ZoneInfo]:
    timezone = _string(raw, "timezone", "timezone") or "UTC"
    problem = (
        f"must be at most {MAX_ZONE_CHARS} characters"
        if len(timezone) > MAX_ZONE_CHARS
        else canonical_zone_problem(timezone)
    )
    if problem is not None:
        raise DefinitionError("timezone", problem)
    try:
        return timezone, ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise DefinitionError("timezone", f"{timezone!r} is not an IANA time zone name") from None


def _cadence(raw: Mapping[str, Any]) -> tuple[str | None, float | None]:
    cron = raw.get("cron")
    every = raw.get("every")
    if (cron is None) == (every is None):
        raise DefinitionError("cron", "exactly one of 'cron' and 'every' is required")
    if cron is None:
        return None, _seconds(raw, "every", "every", None, low=limits.MIN_EVERY_S, high=limits.MAX_EVERY_S)
    if not isinstance(cron, str):
        raise DefinitionError("cron", f"must be a string, got {_type_name(cron)}")
    if len(cron) > limits.MAX_CRON_CHARS:
        raise DefinitionError("cron", f"must be at most {limits.MAX_CRON_CHARS} characters, got {len(cron)}")
    try:
        return CronExpression.parse(cron).text, None
    except CronError as exc:
        raise DefinitionError("cron", str(exc)) from None


def _check_fire_times(definition: ScheduleDefinition, now: datetime) -> None:
    """Compute, once, every instant the stored schedule will need, the way beat, firing and
    retries compute them: what passes here cannot fail later."""
    field_name = "cron" if definition.cron is not None else "every"
    try:
        cadence = Cadence(definition.cron, definition.every_s, definition.timezone, anchor=now)
        first = cadence.slot_after(now)
        second = cadence.slot_after(first)
        cadence.latest_slot(second, since=now)
        # The farthest instants a retry and the execution's deadline will ask for.
        longest_retry = retry_delay_s(definition.retry_base_s, max(definition.max_retries, 1))
        _ = now + timedelta(seconds=longest_retry), now + timedelta(seconds=definition.timeout_s or 0)
    except (CronError, ArithmeticError, ValueError) as exc:
        raise DefinitionError(field_name, f"its fire times cannot be computed ({exc})") from None


def parse_definition(raw: Any, *, rules: StepRules | None = None, now: datetime | None = None) -> ScheduleDefinition:
    """Validate a definition object; raise :class:`DefinitionError` naming the first bad field.

    ``rules`` are the workers' (which tasks are registered, the operator's policy); ``None``
    checks only what holds whatever the settings (:meth:`StepRules.without_policy`).
    """
    raw = _require_mapping(raw, "definition")
    _refuse_unknown(raw, SCHEDULE_FIELDS, "")
    _check_step_counts(raw.get("steps"))
    _check_size(raw)
    name = _schedule_name(raw)
    timezone, _zone = _timezone(raw)
    cron, every_s = _cadence(raw)
    overlap_raw = raw.get("overlap", Overlap.SKIP.value)
    try:
        overlap = Overlap(overlap_raw)
    except ValueError:
        choices = ", ".join(o.value for o in Overlap)
        raise DefinitionError("overlap", f"must be one of {choices}, got {short_repr(overlap_raw)}") from None
    payload = raw.get("payload", {})
    if payload is None:
        payload = {}
    if not isinstance(payload, Mapping):
        raise DefinitionError("payload", f"must be an object, got {_type_name(payload)}")
    _json_value(payload, "payload")
    groups, group_is_list = _parse_groups(raw.get("steps"), rules or _NO_POLICY)
    definition = ScheduleDefinition(
        name=name,
        groups=groups,
        group_is_list=group_is_list,
        cron=cron,
        every_s=every_s,
        timezone=timezone,
        enabled=_bool(raw, "enabled", "enabled", True),
        overlap=overlap,
        max_retries=_int(raw, "max_retries", "max_retries", 0, low=0, high=limits.MAX_RETRIES),
        retry_delay_s=_seconds(
            raw,
            "retry_delay",
            "retry_delay",
            DEFAULT_RETRY_DELAY_S,
            low=limits.MIN_RETRY_DELAY_S,
            high=limits.MAX_RETRY_DELAY_S,
        )
        or DEFAULT_RETRY_DELAY_S,
        total_repeats=_int(raw, "total_repeats", "total_repeats", 0, low=0, high=limits.MAX_TOTAL_REPEATS),
        timeout_s=_seconds(raw, "timeout", "timeout", None, low=limits.MIN_TIMEOUT_S, high=limits.MAX_TIMEOUT_S),
        payload=dict(payload),
    )
    size = limits.json_size(definition.to_json())
    if size > limits.MAX_DEFINITION_BYTES:
        raise DefinitionError("definition", f"is {size} bytes of JSON, more than {limits.MAX_DEFINITION_BYTES}")
    _check_fire_times(definition, now or datetime.now(UTC))
    return definition


def parse_definitions(items: Sequence[Any], *, rules: StepRules | None = None) -> list[ScheduleDefinition]:
    """Validate a list of definitions (a schedule file); errors say which schedule is wrong.

    Every invalid schedule is reported at once (its first problem each, up to
    ``MAX_REPORTED_ERRORS``), so fixing a file takes one try, not one per mistake.
    """
    parsed: list[ScheduleDefinition] = []
    names: set[str] = set()
    errors: list[DefinitionError] = []
    for index, raw in enumerate(items):
        label = raw.get("name") if isinstance(raw, Mapping) else None
        # Only a valid name labels the place: an invalid one may be huge or hold control characters.
        shown_label = isinstance(label, str) and NAME_PATTERN.fullmatch(label)
        where = f"schedules[{index}]" + (f" ({label})" if shown_label else "")
        try:
            definition = parse_definition(raw, rules=rules)
        except DefinitionError as exc:
            errors.append(DefinitionError(f"{where}.{exc.field}", exc.reason))
            continue
        if definition.name in names:
            errors.append(DefinitionError(f"{where}.name", f"schedule {definition.name!r} appears twice"))
        names.add(definition.name)
        parsed.append(definition)
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise DefinitionErrors(errors[:MAX_REPORTED_ERRORS], more=max(0, len(errors) - MAX_REPORTED_ERRORS))
    return parsed


#: Errors of one schedule file shown at once; past that, how many more there are.
MAX_REPORTED_ERRORS = 20
