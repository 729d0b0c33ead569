"""How the CLI's answers look in a terminal: data as inert text, tables that fit 80 columns,
times in the schedule's zone, states coloured, an execution with its steps, errors and warnings."""

from __future__ import annotations

import json
import re
from datetime import datetime, tzinfo
from typing import Any

from rich import box
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

from celeryapp.domain.deadlines import finish_by_after, wall_time
from celeryapp.domain.times import parse_time
from celeryapp.interfaces.display import (
    EARLIER_RUN,
    FAILED_STEP,
    WARNED_STEP,
    alert_words,
    deadline_words,
    label,
    run_state,
    state_style,
)
from celeryapp.interfaces.time_words import clock, here, relative, stamp

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


def time_cell(value: str | datetime | None, zone: tzinfo, viewer: tzinfo | None, now: datetime) -> Text:
    """A time in a table, as :func:`~celeryapp.interfaces.time_words.stamp` writes it, a line per piece: the
    zone's wall time with its offset, the viewer's time when it differs, how far from now
    (``viewer`` None: the column is already in the viewer's zone)."""
    moment = parse_time(value) if isinstance(value, str) or value is None else value
    if moment is None:
        return Text("-")
    # One piece a line: a narrow column wraps the offset under the wall time, never mid-piece.
    cell = Text(clock(moment, zone))
    cell.append("".join(f"\n{p}" for p in (here(moment, zone, viewer), relative(moment, now)) if p), style="dim")
    return cell


#: Narrowest a time column gets: its date and wall time stay on one line, the offset may wrap.
TIME_WIDTH = len("2026-11-22 02:00:00")


def state_text(state: str) -> Text:
    """A stored state in people's words (:func:`~celeryapp.interfaces.display.label`), coloured."""
    return text_of(label(state), state_style(state))


def run_text(execution: dict[str, Any]) -> Text:
    """A run's state as people read it: "completed with warnings" when a step warned."""
    shown = run_state(execution)
    return text_of(shown, state_style(shown) or state_style(execution["status"]))


#: Columns a wrapped line's continuation is indented by.
HANGING_INDENT = 4


class Hanging:
    """A line of text wrapped at word boundaries, its continuation lines indented (a word wider
    than the line is folded, nothing else): for errors, warnings and outputs of any length."""

    def __init__(self, text: Text, indent: int = HANGING_INDENT) -> None:
        self.text = text
        self.indent = indent

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        # The first line has the whole width: wrapped at the continuations' width, a line of 77
        # columns broke "4 s ago" apart although it fitted.
        lines = list(self.text.wrap(console, options.max_width, overflow="fold"))[:1]
        rest = self.text[len(lines[0].plain) :] if lines else self.text
        # What the first line was broken at: its newline, or the spaces between two words.
        rest = rest[1:] if rest.plain.startswith("\n") else rest[len(rest.plain) - len(rest.plain.lstrip(" ")) :]
        if rest.plain:
            lines += rest.wrap(console, max(options.max_width - self.indent, 10), overflow="fold")
        for line in lines:
            line.rstrip()  # the space a line was broken at
        yield Text("\n" + " " * self.indent).join(lines)


def hanging(*parts: Text | str) -> Hanging:
    return Hanging(Text.assemble(*parts))


def cadence_text(schedule: dict[str, Any]) -> str:
    if schedule.get("cron"):
        return f"cron {schedule['cron']}\n{schedule['timezone']}"
    return f"every {schedule['every']:g} s"


def alerting_lines(schedule: dict[str, Any], zone: tzinfo, viewer: tzinfo | None, now: datetime) -> list[Hanging]:
    """A schedule's deadlines and alerts in words, its silence (until when, by whom, why) and how
    many of its alerts are open: nothing for a schedule that has and had none."""
    lines = []
    if deadlines := deadline_words(schedule.get("deadlines"), schedule["timezone"]):
        if finish_by := (schedule["deadlines"] or {}).get("finish_by"):
            # The next one, where the viewer is: an offset apart from the schedule's zone that DST changes.
            there = here(finish_by_after(now, wall_time(finish_by), schedule["timezone"]), zone, viewer)
            deadlines += f" ({there})" if there else ""
        lines.append(hanging(text_of(f"  deadlines: {deadlines}")))
    if alerts := alert_words(schedule.get("alerts")):
        lines.append(hanging(text_of(f"  alerts: {alerts}")))
    elif schedule.get("deadlines"):
        lines.append(hanging(text_of("  alerts: none (a deadline passing is recorded, nobody is told)", "dim")))
    if silenced := schedule.get("silenced"):
        why = f": {silenced['reason']}" if silenced.get("reason") else ""
        until = stamp(silenced["until"], zone, viewer, now)
        lines.append(hanging(text_of(f"  alerts silenced by {silenced['by']} until {until}{why}", "yellow")))
    if count := schedule.get("open_alerts"):
        where = f"chordbeat alerts --schedule {schedule['name']} --status open"
        lines.append(hanging(text_of(f"  {count} open alert{'' if count == 1 else 's'}: ", "bold red"), text_of(where)))
    elif schedule.get("alerts"):
        lines.append(hanging(text_of("  no open alerts", "dim")))
    return lines


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


def bar_style(states: list[str]) -> str:
    """A group's bar colour from its steps' states: red once one failed, yellow with a warning."""
    if any(s in FAILED_STEP for s in states):
        return "red"
    if any(s in WARNED_STEP for s in states):
        return "yellow"
    return "green"


#: A live view's bar counts these as done (a re-run's reused step was done in the earlier run).
FINISHED_STEP = {
    "complete",
    "complete_with_warning",
    "complete_with_error",
    "failed_with_error",
    "cancelled",
    EARLIER_RUN,
}
