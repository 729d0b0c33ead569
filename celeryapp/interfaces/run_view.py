"""How one run looks in a terminal: its header, each step's state in fixed columns, and what its
steps left behind: errors, warnings, outputs, and the last lines of tracebacks and logs."""

from __future__ import annotations

from datetime import datetime, tzinfo
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from celeryapp.interfaces.display import EARLIER_RUN, WARNED_STEP, label, step_states
from celeryapp.interfaces.terminal import Hanging, hanging, new_table, run_text, state_text, text_of
from celeryapp.interfaces.time_words import slot_differs, stamp, took
from models import ActivityStatus, WorkerTaskStatus

#: Fixed widths of the steps table's columns but the step's name, so a live view's columns stay
#: put while states and durations change (the names do not).
GROUP_WIDTH = len("group")
STATE_WIDTH = max(len(label(s)) for s in (*WorkerTaskStatus, *ActivityStatus, EARLIER_RUN))
TRY_WIDTH = len("try")
TOOK_WIDTH = len("59 min 59 s so far")
#: Lines of a step's traceback and of its log shown unless ``--full``: the last ones, where the
#: failure is.
SHOWN_LINES = 20
#: A traceback's or log's lines are indented by 4; their continuations by 8.
TAIL_INDENT = 8

States = dict[tuple[int, str], tuple[str, int]]


def steps_table(execution: dict[str, Any], now: datetime, states: States | None = None) -> Table:
    """Each step's current state, attempt and time, groups numbered from 1 (``states``: the rows to
    show, by default :func:`~celeryapp.interfaces.display.step_states`)."""
    latest = {(a["step_index"], a["step"]): a for a in execution["activities"]}
    table = new_table()
    table.add_column("group", width=GROUP_WIDTH, justify="right", no_wrap=True)
    table.add_column("step")
    table.add_column("state", width=STATE_WIDTH, no_wrap=True)
    table.add_column("try", width=TRY_WIDTH, justify="right", no_wrap=True)
    table.add_column("took", width=TOOK_WIDTH, no_wrap=True)
    for (group, step), (state, attempt) in (step_states(execution) if states is None else states).items():
        activity = latest.get((group, step))
        same = activity is not None and activity["attempt"] == attempt
        duration = took(activity["started_at"], activity["completed_at"], now) if same and activity else ""
        tries = text_of(attempt) if attempt else Text("")  # a step taken from an earlier run ran not here
        table.add_row(text_of(group + 1), text_of(step), state_text(state), tries, text_of(duration))
    return table


def _tail(name: str, text: str | None, full: bool) -> list[RenderableType]:
    """A traceback's or log's last lines (all of them when ``full``), under a line saying how many."""
    lines = (text or "").rstrip("\n").splitlines()
    if not lines:
        return []
    shown = lines if full else lines[-SHOWN_LINES:]
    said = f"  {name}:" if len(shown) == len(lines) else f"  {name}, last {len(shown)} of {len(lines)} lines (--full):"
    return [text_of(said, "dim"), *(Hanging(text_of(f"    {line}"), indent=TAIL_INDENT) for line in shown)]


def step_notes(execution: dict[str, Any], *, evidence: bool = False, full: bool = False) -> list[RenderableType]:
    """What each attempt of each step left: its error or warning; with ``evidence``, also its
    output and the last lines of its traceback and log (``full``: every line). A step waiting for
    shared limits first, with what it waits for."""
    notes: list[RenderableType] = []
    for t in execution["tasks"]:
        if t.get("waiting_for"):  # a step waiting for shared limits: which, and who holds them
            step = f"group {t['step_index'] + 1} {t['step']} (try {t['attempt']})"
            notes.append(hanging(text_of(f"{step}: "), text_of(f"waiting for {t['waiting_for']}", "yellow")))
    for a in execution["activities"]:
        step = f"group {a['step_index'] + 1} {a['step']} (try {a['attempt']})"
        if a["error"]:
            notes.append(hanging(text_of(f"{step}: "), text_of(a["error"], "red")))
        elif a["message"] and a["status"] in WARNED_STEP:
            notes.append(hanging(text_of(f"{step}: warning: "), text_of(a["message"], "yellow")))
        elif a["message"] and evidence:
            notes.append(hanging(text_of(f"{step}: output: "), text_of(a["message"])))
        if evidence:
            if a["error"] and a["message"]:
                notes.append(hanging(text_of("  output: "), text_of(a["message"])))
            notes += _tail("traceback", a.get("traceback"), full) + _tail("log", a.get("log_tail"), full)
    return notes


def execution_text(
    execution: dict[str, Any],
    zone: tzinfo,
    viewer: tzinfo | None,
    now: datetime,
    *,
    states: States | None = None,
    evidence: bool = False,
    full: bool = False,
) -> Group:
    """One run: its state in people's words, when (in the schedule's zone, the viewer's beside it),
    its error, its steps, and what they left (:func:`step_notes`)."""
    length = took(execution["started_at"], execution["completed_at"], now)
    header = Text.assemble(
        text_of(f"execution {execution['id']}", "bold"),
        text_of(f" of {execution['schedule']}: "),
        run_text(execution),
        text_of(f" ({execution['trigger']} run, took {length})"),
    )
    lines: list[RenderableType] = [header]
    if slot_differs(execution.get("slot"), execution["started_at"]):  # a backfill's, a catch-up's, a late one
        lines.append(hanging(text_of(f"  for slot {stamp(execution['slot'], zone, viewer, now)}")))
    lines.append(hanging(text_of(f"  started  {stamp(execution['started_at'], zone, viewer, now)}")))
    if execution["completed_at"]:
        lines.append(hanging(text_of(f"  finished {stamp(execution['completed_at'], zone, viewer, now)}")))
    if execution.get("rerun_of"):
        lines.append(text_of(f"  re-run of execution {execution['rerun_of']} from group {rerun_group(execution)}"))
    if execution["error"]:
        lines.append(hanging("  ", text_of(execution["error"], "red")))
    return Group(*lines, steps_table(execution, now, states), *step_notes(execution, evidence=evidence, full=full))


def rerun_group(execution: dict[str, Any]) -> int:
    """The group a re-run started at, numbered from 1 as people count them."""
    return int(execution.get("rerun_from_group") or 0) + 1
