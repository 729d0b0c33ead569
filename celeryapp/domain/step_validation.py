"""Steps from the contract's JSON: a definition's step groups, each step and what its kind runs.

A step's task, program or SQL variable is checked against the workers' :class:`StepRules`
(registered tasks, the operator's policy); how many steps there are is counted before any is
read, since starting a run writes one row per step.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from typing import Any

from celeryapp.domain import limits
from celeryapp.domain.definition import (
    COMMON_STEP_FIELDS,
    DEFAULT_MAX_ATTEMPTS,
    INVISIBLE_CATEGORIES,
    KIND_FIELDS,
    KIND_OF_TASK,
    KIND_TASKS,
    MAX_ATTEMPTS_LIMIT,
    QUEUE_PATTERN,
    TASK_PATTERN,
    StepKind,
    StepSpec,
)
from celeryapp.domain.fields import (
    bool_field,
    int_field,
    json_field,
    pattern_field,
    refuse_unknown,
    require_mapping,
    seconds_field,
    string_field,
)
from celeryapp.domain.limits import short_repr, type_name
from celeryapp.domain.names import CONTROL_QUEUES
from celeryapp.domain.problems import Problems
from celeryapp.domain.shared_limits import parse_uses
from celeryapp.domain.step_policy import StepRules, env_name_refusal
from celeryapp.errors import DefinitionError


def _step_name(raw: Mapping[str, Any], path: str) -> str:
    """Step names are shown to people: no invisible characters that make look-alikes."""
    name = string_field(raw, "name", path, required=True)
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


def _step_kind(raw: Mapping[str, Any], path: str) -> StepKind:
    raw_kind = raw.get("kind", StepKind.TASK)
    if not isinstance(raw_kind, str) or raw_kind not in KIND_FIELDS:
        choices = ", ".join(k.value for k in StepKind)
        raise DefinitionError(f"{path}.kind", f"must be one of {choices}, got {short_repr(raw_kind)}")
    return StepKind(raw_kind)


def _queue(raw: Mapping[str, Any], path: str) -> str | None:
    queue = pattern_field(
        raw, "queue", f"{path}.queue", QUEUE_PATTERN, "a queue name (letters, digits, '.', '_', '-', ':')"
    )
    if queue in CONTROL_QUEUES:
        raise DefinitionError(f"{path}.queue", f"{queue!r} is a control queue; steps run on their own queues")
    return queue


def _parse_step(raw: Any, path: str, rules: StepRules) -> StepSpec:
    """One step, every field checked; what it runs is checked against the rules of its queue."""
    raw = require_mapping(raw, path)
    kind = _step_kind(raw, path)  # which fields the step may have depends on it: checked alone
    problems = Problems()
    problems.check(refuse_unknown, raw, COMMON_STEP_FIELDS | KIND_FIELDS[kind], path)
    name = problems.check(_step_name, raw, f"{path}.name")
    queue = problems.check(_queue, raw, path)
    runs = None
    if not problems.failed(f"{path}.queue"):
        runs = problems.check(_parse_kind, raw, kind, path, rules.on_queue(queue))
    continue_on_failure = problems.check(bool_field, raw, "continue_on_failure", f"{path}.continue_on_failure", False)
    timeout_s = problems.check(
        seconds_field, raw, "timeout", f"{path}.timeout", None, low=limits.MIN_TIMEOUT_S, high=limits.MAX_TIMEOUT_S
    )
    max_attempts = problems.check(
        int_field, raw, "max_attempts", f"{path}.max_attempts", DEFAULT_MAX_ATTEMPTS, low=1, high=MAX_ATTEMPTS_LIMIT
    )
    uses = problems.check(parse_uses, raw.get("uses"), f"{path}.uses")
    problems.raise_any()
    assert name is not None and runs is not None and continue_on_failure is not None and max_attempts is not None
    assert uses is not None
    task, args, kwargs = runs
    return StepSpec(
        name=name,
        task=task,
        kind=kind,
        args=args,
        kwargs=kwargs,
        continue_on_failure=continue_on_failure,
        timeout_s=timeout_s,
        queue=queue,
        max_attempts=max_attempts,
        uses=uses,
    )


def _task_name(raw: Mapping[str, Any], path: str, rules: StepRules) -> str:
    task = pattern_field(raw, "task", f"{path}.task", TASK_PATTERN, "a Celery task name (printable, no spaces)")
    if task is None:
        raise DefinitionError(f"{path}.task", "is required")
    if task in KIND_OF_TASK:
        raise DefinitionError(f"{path}.task", f'use "kind": "{KIND_OF_TASK[task]}" instead of the task {task!r}')
    refusal = rules.task_refusal(task)
    if refusal:
        raise DefinitionError(f"{path}.task", refusal)
    return task


def _task_arguments(raw: Mapping[str, Any], path: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    problems = Problems()
    args = raw.get("args", [])
    if not isinstance(args, list):
        problems.add(DefinitionError(f"{path}.args", f"must be a list, got {type_name(args)}"))
    else:
        problems.check(json_field, args, f"{path}.args")
    task_kwargs = raw.get("kwargs", {})
    if not isinstance(task_kwargs, Mapping):
        problems.add(DefinitionError(f"{path}.kwargs", f"must be an object, got {type_name(task_kwargs)}"))
    else:
        problems.check(json_field, task_kwargs, f"{path}.kwargs")
    problems.raise_any()
    return tuple(args), dict(task_kwargs)


def _parse_kind(
    raw: Mapping[str, Any], kind: StepKind, path: str, rules: StepRules
) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    """The task, args and kwargs a step of this kind runs, if ``rules`` let it run."""
    problems = Problems()
    if kind in KIND_TASKS:
        refusal = rules.spec_refusal(kind, KIND_TASKS[kind])
        if refusal:
            problems.add(DefinitionError(f"{path}.kind", refusal))
        parse = _parse_executable if kind is StepKind.EXECUTABLE else _parse_sql
        kwargs = problems.check(parse, raw, path, rules)
        problems.raise_any()
        assert kwargs is not None
        return KIND_TASKS[kind], (), kwargs
    task = problems.check(_task_name, raw, path, rules)
    arguments = problems.check(_task_arguments, raw, path)
    problems.raise_any()
    assert task is not None and arguments is not None
    return task, *arguments


def _argv(raw: Mapping[str, Any], path: str, rules: StepRules) -> list[str]:
    argv = raw.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv) or not argv[0]:
        raise DefinitionError(f"{path}.argv", "must be a non-empty list of strings (program first)")
    if any("\0" in a for a in argv):
        raise DefinitionError(f"{path}.argv", "must not contain NUL characters")
    json_field(argv, f"{path}.argv")
    refusal = rules.executable_refusal(argv[0])
    if refusal:
        raise DefinitionError(f"{path}.argv", refusal)
    return list(argv)


def _cwd(raw: Mapping[str, Any], path: str) -> str | None:
    cwd = string_field(raw, "cwd", f"{path}.cwd")
    if cwd is not None and "\0" in cwd:
        raise DefinitionError(f"{path}.cwd", "must not contain NUL characters")
    return cwd


def _env(raw: Mapping[str, Any], path: str) -> dict[str, str] | None:
    env = raw.get("env")
    if env is None:
        return None
    if not isinstance(env, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise DefinitionError(f"{path}.env", "must be an object of variable names to string values")
    problems = Problems()
    for name, value in env.items():
        refusal = env_name_refusal(name) or ("must not contain NUL characters" if "\0" in value else None)
        if refusal:
            problems.add(DefinitionError(f"{path}.env.{name}", refusal))
    problems.raise_any()
    json_field(env, f"{path}.env")
    return dict(env)


def _parse_executable(raw: Mapping[str, Any], path: str, rules: StepRules) -> dict[str, Any]:
    problems = Problems()
    argv = problems.check(_argv, raw, path, rules)
    cwd = problems.check(_cwd, raw, path)
    env = problems.check(_env, raw, path)
    problems.raise_any()
    kwargs: dict[str, Any] = {"argv": argv}
    if cwd is not None:
        kwargs["cwd"] = cwd
    if env is not None:
        kwargs["env"] = env
    return kwargs


def _database_env(raw: Mapping[str, Any], path: str, rules: StepRules) -> str:
    variable = string_field(raw, "database_env", f"{path}.database_env", required=True)
    assert variable is not None
    refusal = rules.sql_env_refusal(variable)
    if refusal:
        raise DefinitionError(f"{path}.database_env", refusal)
    return variable


def _script(raw: Mapping[str, Any], path: str) -> str:
    script = string_field(raw, "script", f"{path}.script", required=True)
    assert script is not None
    json_field(script, f"{path}.script")
    return script


def _parse_sql(raw: Mapping[str, Any], path: str, rules: StepRules) -> dict[str, Any]:
    problems = Problems()
    script = problems.check(_script, raw, path)
    variable = problems.check(_database_env, raw, path, rules)
    problems.raise_any()
    return {"script": script, "database_env": variable}


def check_step_counts(raw: Any) -> None:
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


def parse_groups(raw: Any, rules: StepRules) -> tuple[tuple[tuple[StepSpec, ...], ...], tuple[bool, ...]]:
    """A definition's step groups, and per group whether it was written as a list; each step
    name is used once across all of them. Every bad step is reported, each with every error."""
    if not isinstance(raw, list) or not raw:
        raise DefinitionError("steps", "must be a non-empty list of step groups")
    problems = Problems()
    groups: list[tuple[StepSpec, ...]] = []
    is_list: list[bool] = []
    seen: dict[str, str] = {}
    for index, group in enumerate(raw):
        path = f"steps[{index}]"
        if isinstance(group, list) and not group:
            problems.add(DefinitionError(path, "a parallel group must hold at least one step"))
            continue
        members = [(f"{path}[{i}]", s) for i, s in enumerate(group)] if isinstance(group, list) else [(path, group)]
        steps = []
        for where, member in members:
            step = problems.check(_parse_step, member, where, rules)
            if step is None:
                continue
            if step.name in seen:
                problems.add(
                    DefinitionError(f"{where}.name", f"step name {step.name!r} is already used by {seen[step.name]}")
                )
            seen.setdefault(step.name, where)
            steps.append(step)
        groups.append(tuple(steps))
        is_list.append(isinstance(group, list))
    problems.raise_any()
    return tuple(groups), tuple(is_list)
