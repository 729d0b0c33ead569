"""Following a run until it ends: live, a progress bar per step group and each step's state in
columns that stay put, or quietly for ``--json``."""

from __future__ import annotations

import sys
import time
from typing import Any

from rich.console import Group

from celeryapp.interfaces.cli.calls import call, console, echo_json, new_client, reference_now, viewer_zone
from celeryapp.interfaces.terminal import FINISHED_STEP, bar_style, text_of


def watch(execution_id: int) -> dict[str, Any]:
    """Live view until the run ends: a progress bar per step group and each step's state.

    Every step seen stays a row, in the order first seen (the plan's: its tasks exist from the
    start), and the table's columns have fixed widths: a frame only changes what is in the cells."""
    from rich.live import Live
    from rich.progress import BarColumn, Progress, Task, TextColumn
    from rich.progress_bar import ProgressBar

    from celeryapp.interfaces.display import step_states
    from celeryapp.interfaces.run_view import execution_text
    from celeryapp.interfaces.time_words import zone_of

    class Bar(BarColumn):  # type: ignore[misc]
        def render(self, task: Task) -> ProgressBar:
            style = task.fields.get("bar_style", "green")
            return ProgressBar(
                total=max(0, task.total or 0),
                completed=max(0, task.completed),
                width=self.bar_width,
                pulse=not task.started,
                animation_time=task.get_time(),
                style=self.style,
                complete_style=style,
                finished_style=style,
                pulse_style=self.pulse_style,
            )

    client = new_client()
    try:
        first: dict[str, Any] = client.get_execution(execution_id)
        try:
            zone = zone_of(client.get_schedule(first["schedule"])["timezone"])
        except Exception:  # the schedule was deleted since: times in UTC
            zone = zone_of("UTC")
        viewer = viewer_zone()
        known = step_states(first)
        sizes: dict[int, int] = {}
        for group, _step in known:
            sizes[group] = sizes.get(group, 0) + 1
        progress = Progress(
            TextColumn("group {task.fields[number]}"), Bar(bar_width=30), TextColumn("{task.completed}/{task.total}")
        )
        bars = {g: progress.add_task("", total=n, number=g + 1, bar_style="green") for g, n in sorted(sizes.items())}
        with Live(progress, console=console, refresh_per_second=8, transient=False) as live:
            while True:
                execution: dict[str, Any] = client.get_execution(execution_id)
                known.update(step_states(execution))  # a known step keeps its row and its place
                states = dict(sorted(known.items(), key=lambda item: item[0][0]))
                for group, bar in bars.items():
                    mine = [state for (g, _s), (state, _a) in states.items() if g == group]
                    done = sum(1 for state in mine if state in FINISHED_STEP)
                    progress.update(bar, completed=done, bar_style=bar_style(mine))
                view = execution_text(execution, zone, viewer, reference_now(), states=states)
                live.update(Group(progress, view))
                if execution["status"] != "in_progress":
                    return execution
                time.sleep(0.25)
    finally:
        client.close()


def watch_or_explain(execution_id: int) -> dict[str, Any]:
    """:func:`watch`; Ctrl-C stops watching only, and says so: the run goes on."""
    try:
        return watch(execution_id)
    except KeyboardInterrupt:
        console.print(
            text_of(
                f"stopped watching; execution {execution_id} goes on.\n"
                f"  watch again: chordbeat execution {execution_id} --watch\n"
                f"  cancel it:   chordbeat cancel {execution_id}",
                "yellow",
            )
        )
        sys.exit(130)


def wait_quietly(execution_id: int) -> dict[str, Any]:
    while True:
        execution: dict[str, Any] = call("get_execution", execution_id)
        if execution["status"] != "in_progress":
            return execution
        time.sleep(0.25)


def follow(execution_id: int, as_json: bool) -> None:
    """Follow a run to its end (live, or quietly printing its JSON); exit 0 only if it completed."""
    execution = wait_quietly(execution_id) if as_json else watch_or_explain(execution_id)
    if as_json:
        echo_json(execution)
    sys.exit(0 if execution["status"] == "completed" else 1)
