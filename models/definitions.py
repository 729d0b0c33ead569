"""A stored schedule read back as the definition it was written from."""

from __future__ import annotations

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
from models.tables import Schedule, ScheduleStep


def definition_of(schedule: Schedule) -> ScheduleDefinition:
    groups: dict[int, list[ScheduleStep]] = {}
    for step in schedule.steps:
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
