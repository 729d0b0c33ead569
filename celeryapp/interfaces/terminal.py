"""How the CLI's answers look in a terminal: data as inert text, tables that fit 80 columns,
times in the schedule's zone, states coloured, an execution with its steps, errors and warnings."""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from celeryapp.domain.times import clock, parse_time, relative, took, when
from celeryapp.interfaces.display import FAILED_STEP, WARNED_STEP, state_style, step_states

#: Characters that steer a terminal or reorder text (C0 and C1 controls but tab and newline, line
#: and paragraph separators, bidi controls). Names, errors and outputs are data: shown as escapes.
UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def printable(value: object) -> str:
    """``value`` as inert text: terminal controls and bidi overrides become visible escapes."""
    return UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(value))


def text_of(value: object, style: str = "") -> Text:
    """A table cell or line from data: a Text is never parsed for markup (``[/]``, ``[link=…]``)."""
    return Text(printable(value), style=style)


def new_table(*columns: str, title: str | None = None) -> Table:
    """A table as every command draws it: light lines, narrow padding, so it fits 80 columns."""
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False, title=title, title_justify="left")
    for column in columns:
        table.add_column(column)
    return table


def time_cell(value: str | datetime | None, zone: ZoneInfo, now: datetime) -> Text:
    """A time in a table: the zone's wall time, then its offset and zone and how far from now."""
    moment = parse_time(value) if isinstance(value, str) or value is None else value
    if moment is None:
        return Text("-")
    day, wall, offset_zone = clock(moment, zone).split(" ", 2)
    cell = Text(f"{day} {wall}\n")
    cell.append(f"{offset_zone}, {relative(moment, now)}", style="dim")
    return cell


def state_text(state: str) -> Text:
    return text_of(state, state_style(state))


def cadence_text(schedule: dict[str, Any]) -> str:
    if schedule.get("cron"):
        return f"cron {schedule['cron']}\n{schedule['timezone']}"
    return f"every {schedule['every']:g} s"


def definition_table(schedule: dict[str, Any]) -> Table:
    """The schedule's step groups, numbered from 1, one row per step."""
    table = new_table("group", "step", "task and options", title="steps")
    for number, group in enumerate(schedule["steps"], start=1):
        for step in group if isinstance(group, list) else [group]:
            options = [
                f"{key}={json.dumps(step[key], ensure_ascii=False)}"
                for key in ("args", "kwargs", "continue_on_failure", "timeout", "queue", "max_attempts")
                if step.get(key) not in (None, [], {}, False)
            ]
            task = text_of(step.get("task", ""))
            if options:
                task.append_text(text_of("\n" + " ".join(options), "dim"))
            table.add_row(text_of(number), text_of(step["name"]), task)
    return table


def steps_table(execution: dict[str, Any], now: datetime) -> Table:
    """Each step's current state, attempt and time, groups numbered from 1; errors and warnings below."""
    latest = {(a["step_index"], a["step"]): a for a in execution["activities"]}
    table = new_table("group", "step", "state", "try", "took")
    for (group, step), (state, attempt) in step_states(execution).items():
        activity = latest.get((group, step))
        same = activity is not None and activity["attempt"] == attempt
        duration = took(activity["started_at"], activity["completed_at"], now) if same and activity else ""
        table.add_row(text_of(group + 1), text_of(step), state_text(state), text_of(attempt), text_of(duration))
    return table


def execution_notes(execution: dict[str, Any]) -> list[Text]:
    """Errors and warnings of the steps, newest attempt of each, as lines."""
    lines = []
    for a in execution["activities"]:
        if a["error"]:
            lines.append(
                Text.assemble(
                    text_of(f"group {a['step_index'] + 1} {a['step']} (try {a['attempt']}): "),
                    text_of(a["error"], "red"),
                )
            )
        elif a["message"] and a["status"] in {"complete_with_warning", "complete_with_error"}:
            lines.append(
                Text.assemble(
                    text_of(f"group {a['step_index'] + 1} {a['step']}: warning: "), text_of(a["message"], "yellow")
                )
            )
    return lines


def execution_view(execution: dict[str, Any], zone: ZoneInfo, now: datetime) -> Group:
    header = Text.assemble(
        text_of(f"execution {execution['id']}", "bold"),
        text_of(f" of {execution['schedule']}: "),
        state_text(execution["status"]),
    )
    lines = [header, text_of(f"  {execution['trigger']} run, started {when(execution['started_at'], zone, now)}")]
    if execution["completed_at"]:
        lines.append(
            text_of(
                f"  finished {when(execution['completed_at'], zone, now)}, "
                f"took {took(execution['started_at'], execution['completed_at'], now)}"
            )
        )
    if execution["error"]:
        lines.append(Text.assemble("  ", text_of(execution["error"], "red")))
    return Group(*lines, steps_table(execution, now), *execution_notes(execution))


def bar_style(states: list[str]) -> str:
    """A group's bar colour from its steps' states: red once one failed, yellow with a warning."""
    if any(s in FAILED_STEP for s in states):
        return "red"
    if any(s in WARNED_STEP for s in states):
        return "yellow"
    return "green"


FINISHED_STEP = {"complete", "complete_with_warning", "complete_with_error", "failed_with_error", "cancelled"}
