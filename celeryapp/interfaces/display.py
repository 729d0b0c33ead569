"""How the CLI and the dashboard show states to people: their words (:func:`label`, never a
stored name such as ``failed_with_error``), a run's state with its warnings (:func:`run_state`),
their colours, and each step's current state in a run.

Times and lengths of time are shown as :mod:`celeryapp.domain.times` writes them. Pure functions:
no I/O.
"""

from __future__ import annotations

from typing import Any

#: A completed run one of whose steps warned or failed with ``continue_on_failure``: not stored
#: (the contract fixes a run's states), derived from its steps.
COMPLETED_WITH_WARNINGS = "completed with warnings"
#: A step of a re-run's group taken from the run it re-runs (not run again): completed there.
EARLIER_RUN = "completed_in_earlier_run"
#: People's words for stored state names (schedule, execution, worker task, activity and slot
#: outcome); a name not here is shown with its underscores as spaces.
LABELS = {
    "in_progress": "running",
    "processing": "running",
    "waiting_for_previous_step": "waiting",
    "waiting_for_limit": "waiting for limit",
    "complete": "completed",
    "complete_with_warning": "warning",
    "complete_with_error": "error, went on",
    "failed_with_error": "failed",
    "skipped_overlap": "skipped: overlap",
    "skipped_paused": "skipped: paused",
    "skipped_superseded": "skipped: superseded",
    "skipped_calendar": "skipped: calendar",
    EARLIER_RUN: "completed earlier",
}

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
    "waiting_for_limit": "yellow",
    "completed": "green",
    "complete": "green",
    EARLIER_RUN: "green",
    "complete_with_warning": "yellow",
    "complete_with_error": "dark_orange",
    "failed": "bold red",
    "failed_with_error": "bold red",
    "cancelled": "magenta",
    COMPLETED_WITH_WARNINGS: "yellow",
}
#: Step states that count as trouble in their group (its bar turns red or yellow).
FAILED_STEP = frozenset({"failed_with_error", "cancelled"})
WARNED_STEP = frozenset({"complete_with_warning", "complete_with_error"})


def state_style(state: str) -> str:
    return STATE_STYLES.get(state, "")


def label(state: str) -> str:
    """People's words for a stored state name: ``failed_with_error`` is "failed"."""
    return LABELS.get(state, state.replace("_", " "))


def warned(execution_or_summary: dict[str, Any]) -> bool:
    """Whether a step of the run warned or failed with ``continue_on_failure``: from a summary's
    ``steps`` counts or a whole execution's ``activities``."""
    counts = execution_or_summary.get("steps") or {}
    if any(counts.get(state) for state in WARNED_STEP):
        return True
    return any(a.get("status") in WARNED_STEP for a in execution_or_summary.get("activities") or ())


def run_state(execution_or_summary: dict[str, Any]) -> str:
    """A run's state in people's words: "completed with warnings" for a completed run with a
    warned step (:func:`warned`), else the label of its status."""
    status = str(execution_or_summary.get("status", ""))
    if status == "completed" and warned(execution_or_summary):
        return COMPLETED_WITH_WARNINGS
    return label(status)


def step_states(execution: dict[str, Any]) -> dict[tuple[int, str], tuple[str, int]]:
    """Each step's current state and attempt, in run order: its open task or its latest activity;
    a re-run's step taken from the run it re-runs is :data:`EARLIER_RUN` (attempt 0).

    Within a group, steps keep the definition's order (the execution's ``groups``), not the order
    they happened to start or end in, so a live view's rows do not swap places."""
    groups = execution.get("groups") or []
    position = {(index, name): n for index, group in enumerate(groups) for n, name in enumerate(group)}
    order: dict[tuple[int, str], int] = {}
    for row in (*execution["tasks"], *execution["activities"]):
        order.setdefault((row["step_index"], row["step"]), len(order))
    states: dict[tuple[int, str], tuple[str, int]] = {}
    if execution.get("rerun_of"):
        reused = int(execution.get("rerun_from_group") or 0)
        states.update({key: (EARLIER_RUN, 0) for key in position if key[0] < reused})
    for a in execution["activities"]:  # ordered by attempt within a step
        states[(a["step_index"], a["step"])] = (a["status"], a["attempt"])
    for t in execution["tasks"]:
        key = (t["step_index"], t["step"])
        running = states.get(key, ("", 0))
        # A processing task's running attempt already shows as its in-progress activity.
        if not (running[0] == "in_progress" and running[1] == t["attempt"]):
            states[key] = (t["status"], t["attempt"])

    def place(key: tuple[int, str]) -> tuple[int, int, int]:
        return key[0], position.get(key, len(position)), order.get(key, 0)

    return dict(sorted(states.items(), key=lambda item: place(item[0])))


def length_words(seconds: float) -> str:
    """A deadline's length, exact (unlike :func:`~celeryapp.domain.times.span`, which rounds to two
    units): ``15 min``, ``1 h 30 min``, ``1 d 0 h 0 min 5 s`` is ``1 d 5 s``, ``90.5 s`` is ``1 min 30.5 s``."""
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{int(n)} {unit}" for n, unit in ((days, "d"), (hours, "h"), (minutes, "min")) if n]
    if secs or not parts:
        parts.append(f"{round(secs, 3):g} s")
    return " ".join(parts)


def deadline_words(deadlines: dict[str, Any] | None, timezone: str) -> str | None:
    """A definition's ``deadlines`` in people's words: ``start within 15 min, finish within 1 h,
    finish by 06:00 Europe/London`` (``finish_by`` is a wall time of the schedule's zone); None
    when it has none."""
    if not deadlines:
        return None
    parts = [
        f"{words} within {length_words(float(deadlines[key]))}"
        for key, words in (("start_within", "start"), ("finish_within", "finish"))
        if deadlines.get(key) is not None
    ]
    if deadlines.get("finish_by") is not None:
        parts.append(f"finish by {deadlines['finish_by']} {timezone}")
    return ", ".join(parts)


def alert_words(alerts: dict[str, Any] | None) -> str | None:
    """A definition's ``alerts``: what raises one and where it goes, ``failed, late → ops-pager,
    ops-mail``; None when it has none."""
    if not alerts:
        return None
    return f"{', '.join(alerts.get('on') or ())} → {', '.join(alerts.get('channels') or ())}"
