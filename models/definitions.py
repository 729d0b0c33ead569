"""A stored schedule read back as the definition it was written from: from its ORM object, or from
its rows as a list of many reads them (columns, no objects: building 500 schedule objects with
their steps cost a page of ``list_schedules`` most of its time)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from celeryapp.domain.catchup import CatchupRules
from celeryapp.domain.definition import (
    KIND_OF_TASK,
    AlertRules,
    CalendarRules,
    Deadlines,
    ScheduleDefinition,
    StepKind,
    StepSpec,
    uses_of,
)
from celeryapp.domain.dst_rules import DstRules
from celeryapp.states import Overlap
from models.tables import Schedule


class StepFields(Protocol):
    """A step's stored columns: a ``ScheduleStep``, or a row of ``schedule_steps``."""

    @property
    def step_index(self) -> int: ...
    @property
    def position(self) -> int: ...
    @property
    def in_list(self) -> bool: ...
    @property
    def name(self) -> str: ...
    @property
    def task(self) -> str: ...
    @property
    def args(self) -> list[Any]: ...
    @property
    def kwargs(self) -> dict[str, Any]: ...
    @property
    def continue_on_failure(self) -> bool: ...
    @property
    def timeout_s(self) -> float | None: ...
    @property
    def queue(self) -> str | None: ...
    @property
    def max_attempts(self) -> int: ...
    @property
    def uses(self) -> list[Any] | None: ...


class DefinitionFields(Protocol):
    """A schedule's stored definition columns (its steps apart): a ``Schedule``, or a row of
    ``schedules``."""

    @property
    def name(self) -> str: ...
    @property
    def cron(self) -> str | None: ...
    @property
    def every_s(self) -> float | None: ...
    @property
    def timezone(self) -> str: ...
    @property
    def enabled(self) -> bool: ...
    @property
    def overlap(self) -> Overlap: ...
    @property
    def max_retries(self) -> int: ...
    @property
    def retry_delay_s(self) -> float: ...
    @property
    def total_repeats(self) -> int: ...
    @property
    def timeout_s(self) -> float | None: ...
    @property
    def payload(self) -> dict[str, Any]: ...
    @property
    def deadlines(self) -> dict[str, Any] | None: ...
    @property
    def alerts(self) -> dict[str, Any] | None: ...
    @property
    def calendar(self) -> dict[str, Any] | None: ...
    @property
    def catchup(self) -> dict[str, Any] | None: ...
    @property
    def dst(self) -> dict[str, Any] | None: ...
    @property
    def uses(self) -> list[Any] | None: ...


def definition_of(schedule: Schedule) -> ScheduleDefinition:
    return definition_from(schedule, schedule.steps)


def definition_from(schedule: DefinitionFields, steps: Iterable[StepFields]) -> ScheduleDefinition:
    """The definition a schedule's columns and its steps' make."""
    groups: dict[int, list[StepFields]] = {}
    for step in steps:
        groups.setdefault(step.step_index, []).append(step)
    ordered = [sorted(groups[i], key=lambda s: s.position) for i in sorted(groups)]
    return ScheduleDefinition(
        name=schedule.name,
        groups=tuple(
            tuple(
                StepSpec(
                    name=s.name,
                    kind=KIND_OF_TASK.get(s.task, StepKind.TASK),
                    task=s.task,
                    args=tuple(s.args),
                    kwargs=dict(s.kwargs),
                    continue_on_failure=s.continue_on_failure,
                    timeout_s=s.timeout_s,
                    queue=s.queue,
                    max_attempts=s.max_attempts,
                    uses=uses_of(s.uses),
                )
                for s in group
            )
            for group in ordered
        ),
        group_is_list=tuple(group[0].in_list for group in ordered),
        cron=schedule.cron,
        every_s=schedule.every_s,
        timezone=schedule.timezone,
        enabled=schedule.enabled,
        overlap=schedule.overlap,
        max_retries=schedule.max_retries,
        retry_delay_s=schedule.retry_delay_s,
        total_repeats=schedule.total_repeats,
        timeout_s=schedule.timeout_s,
        payload=dict(schedule.payload),
        deadlines=Deadlines.from_json(schedule.deadlines),
        alerts=AlertRules.from_json(schedule.alerts),
        calendar=CalendarRules.from_json(schedule.calendar),
        catchup=CatchupRules.from_json(schedule.catchup),
        dst=DstRules.from_json(schedule.dst),
        uses=uses_of(schedule.uses),
    )
