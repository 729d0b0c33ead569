"""How the CLI shows states to people: their colours, and each step's current state in a run.

Times and lengths of time are shown as :mod:`celeryapp.domain.times` writes them, as the dashboard
shows them. Pure functions: no I/O.
"""

from __future__ import annotations

from typing import Any

#: Colour of each stored state (schedule, execution, worker task and activity states).
STATE_STYLES = {
    "active": "green",
    "paused": "yellow",
    "done": "blue",
    "dead": "bold red",
    "in_progress": "cyan",
    "processing": "cyan",
    "queued": "bright_black",
    "waiting_for_previous_step": "bright_black",
    "completed": "green",
    "complete": "green",
    "complete_with_warning": "yellow",
    "complete_with_error": "dark_orange",
    "failed": "bold red",
    "failed_with_error": "bold red",
    "cancelled": "magenta",
}
#: Step states that count as trouble in their group (its bar turns red or yellow).
FAILED_STEP = frozenset({"failed_with_error", "cancelled"})
WARNED_STEP = frozenset({"complete_with_warning", "complete_with_error"})


def state_style(state: str) -> str:
    return STATE_STYLES.get(state, "")


def step_states(execution: dict[str, Any]) -> dict[tuple[int, str], tuple[str, int]]:
    """Each step's current state and attempt, in run order: its open task or its latest activity."""
    states: dict[tuple[int, str], tuple[str, int]] = {}
    for a in execution["activities"]:  # ordered by attempt within a step
        states[(a["step_index"], a["step"])] = (a["status"], a["attempt"])
    for t in execution["tasks"]:
        key = (t["step_index"], t["step"])
        running = states.get(key, ("", 0))
        # A processing task's running attempt already shows as its in-progress activity.
        if not (running[0] == "in_progress" and running[1] == t["attempt"]):
            states[key] = (t["status"], t["attempt"])
    return dict(sorted(states.items(), key=lambda item: item[0][0]))
