"""Schedule definitions as typed, immutable values: a schedule, its step groups and steps, the
names, patterns and defaults they use. :mod:`celeryapp.domain.validation` makes them from the
contract's JSON.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import date
from enum import StrEnum
from typing import Any
from zoneinfo import ZoneInfo

from celeryapp.domain import limits
from celeryapp.domain.catchup import CatchupRules
from celeryapp.domain.dst_rules import DstRules
from celeryapp.states import AlertKind, Overlap

#: Schedule names end up in Redis keys, CLI arguments and metric labels: keep them plain.
#: (Matched whole: ``$`` would also match before a trailing newline.)
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
#: Queues a step may name: what Celery and the ``-Q`` option take without quoting.
QUEUE_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,199}")
#: Celery task names: printable ASCII, no spaces.
TASK_PATTERN = re.compile(r"[!-~]{1,200}")
DEFAULT_RETRY_DELAY_S = 60.0
DEFAULT_MAX_ATTEMPTS = 3
MAX_ATTEMPTS_LIMIT = limits.MAX_ATTEMPTS
#: Unicode categories refused in step names: controls, format characters (zero-width, bidi
#: overrides), surrogates, private use, unassigned, line and paragraph separators.
INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
#: The longest time zone name (the column is 64 characters).
MAX_ZONE_CHARS = 64

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
        "deadlines",
        "alerts",
        "calendar",
        "catchup",
        "dst",
        "uses",
        "steps",
    }
)
#: What a definition's ``alerts.on`` may name; ``resolved`` follows ``late``, ``test`` is an operator's.
ALERT_ON_KINDS = (AlertKind.FAILED, AlertKind.DEAD, AlertKind.MISSED, AlertKind.LATE)
COMMON_STEP_FIELDS = frozenset({"name", "kind", "continue_on_failure", "timeout", "queue", "max_attempts", "uses"})


class StepKind(StrEnum):
    """What a step runs (its ``kind`` in the JSON): a Celery task, a program, or an SQL script."""

    TASK = "task"
    EXECUTABLE = "executable"
    SQL = "sql"


#: Fields of each step kind, and the built-in task that runs the non-task kinds.
KIND_FIELDS = {
    StepKind.TASK: frozenset({"task", "args", "kwargs"}),
    StepKind.EXECUTABLE: frozenset({"argv", "cwd", "env"}),
    StepKind.SQL: frozenset({"script", "database_env"}),
}
ALL_STEP_FIELDS = COMMON_STEP_FIELDS.union(*KIND_FIELDS.values())
KIND_TASKS = {StepKind.EXECUTABLE: "chordbeat.steps.executable", StepKind.SQL: "chordbeat.steps.sql"}
KIND_OF_TASK = {task: kind for kind, task in KIND_TASKS.items()}


@dataclass(frozen=True)
class LimitUse:
    """One shared limit a step uses, and how many of its slots (``"warehouse"`` is one slot).
    The limits themselves are :mod:`celeryapp.domain.shared_limits`'s."""

    limit: str
    slots: int = 1

    def to_json(self) -> str | dict[str, Any]:
        return self.limit if self.slots == 1 else {"limit": self.limit, "slots": self.slots}

    @classmethod
    def from_json(cls, raw: str | Mapping[str, Any]) -> LimitUse:
        """Rebuild from :meth:`to_json` output (already validated)."""
        return cls(raw) if isinstance(raw, str) else cls(raw["limit"], int(raw.get("slots", 1)))


def uses_of(raw: Any) -> tuple[LimitUse, ...]:
    """``uses`` as stored (a list, or None when not given) read back."""
    return tuple(LimitUse.from_json(use) for use in raw or ())


def combined_uses(schedule_uses: tuple[LimitUse, ...], step_uses: tuple[LimitUse, ...]) -> tuple[LimitUse, ...]:
    """What a step of a run uses: its schedule's ``uses``, then its own; a limit both name is
    taken as the step names it (its slot count)."""
    own = {use.limit for use in step_uses}
    return tuple(use for use in schedule_uses if use.limit not in own) + step_uses


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
    kind: StepKind = StepKind.TASK
    #: Shared limits the step takes slots of before it runs (docs/limits.md).
    uses: tuple[LimitUse, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.kind is not StepKind.TASK:
            out["kind"] = self.kind.value  # a plain str: YAML and repr() do not know the enum
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
        if self.uses:
            out["uses"] = [use.to_json() for use in self.uses]
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> StepSpec:
        """Rebuild from :meth:`to_json` output (already validated, e.g. an execution's plan)."""
        kind = StepKind(raw.get("kind", StepKind.TASK))
        if kind is StepKind.TASK:
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
            uses=uses_of(raw.get("uses")),
        )


@dataclass(frozen=True)
class Deadlines:
    """When a slot's run must have started and ended (the definition's ``deadlines``; at least one
    is set). The deadline watch (celeryapp/alerting/deadline_watch.py) reads them."""

    #: Seconds after the nominal slot.
    start_within_s: float | None = None
    finish_within_s: float | None = None
    #: ``HH:MM`` in the schedule's zone: the first such wall-clock time after the slot.
    finish_by: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.start_within_s is not None:
            out["start_within"] = _number_out(self.start_within_s)
        if self.finish_within_s is not None:
            out["finish_within"] = _number_out(self.finish_within_s)
        if self.finish_by is not None:
            out["finish_by"] = self.finish_by
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any] | None) -> Deadlines | None:
        """Rebuild from :meth:`to_json` output (as stored); ``None`` stays ``None``."""
        if raw is None:
            return None
        start, finish = raw.get("start_within"), raw.get("finish_within")
        return cls(
            start_within_s=None if start is None else float(start),
            finish_within_s=None if finish is None else float(finish),
            finish_by=raw.get("finish_by"),
        )


@dataclass(frozen=True)
class AlertRules:
    """Where a schedule's alerts go and which kinds it asks for (the definition's ``alerts``).
    Channels are names of the ``CHORDBEAT_ALERT_CHANNELS`` file, kept in the order written."""

    channels: tuple[str, ...]
    on: tuple[AlertKind, ...]

    def to_json(self) -> dict[str, Any]:
        return {"channels": list(self.channels), "on": [kind.value for kind in self.on]}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any] | None) -> AlertRules | None:
        """Rebuild from :meth:`to_json` output (as stored); ``None`` stays ``None``."""
        if raw is None:
            return None
        return cls(channels=tuple(raw["channels"]), on=tuple(AlertKind(kind) for kind in raw["on"]))


class OnExcluded(StrEnum):
    """What a slot on an excluded day does (the definition's ``calendar.on_excluded``)."""

    #: Nothing starts; the slot is recorded ``skipped_calendar``.
    SKIP = "skip"
    #: The run starts at the same wall time on the next weekday that is not excluded.
    NEXT_BUSINESS_DAY = "next_business_day"


@dataclass(frozen=True)
class CalendarRules:
    """The days a schedule does not run (the definition's ``calendar``): its own dates and the
    named calendars of the ``CHORDBEAT_CALENDARS_DIR`` directory, both kept in the order written."""

    exclude: tuple[date, ...] = ()
    calendars: tuple[str, ...] = ()
    on_excluded: OnExcluded = OnExcluded.SKIP

    def to_json(self) -> dict[str, Any]:
        return {
            "exclude": [day.isoformat() for day in self.exclude],
            "calendars": list(self.calendars),
            "on_excluded": self.on_excluded.value,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any] | None) -> CalendarRules | None:
        """Rebuild from :meth:`to_json` output (as stored); ``None`` stays ``None``."""
        if raw is None:
            return None
        return cls(
            exclude=tuple(date.fromisoformat(day) for day in raw.get("exclude", ())),
            calendars=tuple(raw.get("calendars", ())),
            on_excluded=OnExcluded(raw.get("on_excluded", OnExcluded.SKIP)),
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
    deadlines: Deadlines | None = None
    alerts: AlertRules | None = None
    calendar: CalendarRules | None = None
    #: ``None``: the default policy, ``latest``.
    catchup: CatchupRules | None = None
    #: ``None``: the default DST rule (cron.py's docstring); cron schedules only.
    dst: DstRules | None = None
    #: Shared limits every step of its runs uses (besides each step's own).
    uses: tuple[LimitUse, ...] = ()

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    @property
    def retry_base_s(self) -> float:
        return retry_base_s(self.every_s, self.retry_delay_s)

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
            # Null when not given: the schedule object always carries both.
            deadlines=self.deadlines.to_json() if self.deadlines is not None else None,
            alerts=self.alerts.to_json() if self.alerts is not None else None,
            calendar=self.calendar.to_json() if self.calendar is not None else None,
            catchup=self.catchup.to_json() if self.catchup is not None else None,
            dst=self.dst.to_json() if self.dst is not None else None,
        )
        if self.uses:
            out["uses"] = [use.to_json() for use in self.uses]
        out.update(
            steps=[
                [s.to_json() for s in group] if is_list else group[0].to_json()
                for group, is_list in zip(self.groups, self.group_is_list, strict=True)
            ],
        )
        return out

    @property
    def run_groups(self) -> tuple[tuple[StepSpec, ...], ...]:
        """The step groups as a run has them: each step with what it uses in all (its schedule's
        ``uses`` and its own)."""
        if not self.uses:
            return self.groups
        return tuple(tuple(replace(s, uses=combined_uses(self.uses, s.uses)) for s in group) for group in self.groups)

    def plan(self) -> list[list[dict[str, Any]]]:
        """The step groups as stored on an execution (:attr:`run_groups`): a run keeps to what it
        started with."""
        return [[s.to_json() for s in group] for group in self.run_groups]


def retry_base_s(every_s: float | None, retry_delay_s: float) -> float:
    """Base of the retry backoff: the interval for ``every`` schedules, else ``retry_delay``."""
    return every_s if every_s is not None else retry_delay_s


def _number_out(value: float | None) -> float | int | None:
    if value is None:
        return None
    return int(value) if float(value).is_integer() else value
