"""How the CLI and the dashboard show states: pure functions, no Redis. Times: tests/test_times.py."""

from __future__ import annotations

import pytest

from celeryapp.interfaces.display import alert_words, deadline_words, label, length_words, run_state
from celeryapp.interfaces.terminal import bar_style
from models import ActivityStatus, ExecutionStatus, ScheduleStatus, SlotOutcome, WorkerTaskStatus


def test_a_group_with_a_failed_step_is_not_a_green_bar() -> None:
    assert bar_style(["complete", "complete"]) == "green"
    assert bar_style(["complete", "complete_with_warning"]) == "yellow"
    assert bar_style(["complete", "failed_with_error", "complete_with_warning"]) == "red"
    assert bar_style(["cancelled"]) == "red"


def test_people_read_words_not_stored_names() -> None:
    assert label("failed_with_error") == "failed"
    assert label("waiting_for_previous_step") == "waiting"
    assert label("in_progress") == label("processing") == "running"
    assert label("complete") == label("completed") == "completed"
    assert label("skipped_paused") == "skipped: paused"
    assert label("something_new") == "something new"


@pytest.mark.parametrize(
    "state",
    [*ScheduleStatus, *ExecutionStatus, *WorkerTaskStatus, *ActivityStatus, *SlotOutcome],
)
def test_no_stored_state_shows_with_an_underscore_or_wider_than_a_state_column(state: str) -> None:
    assert "_" not in label(state) and 0 < len(label(state)) <= 19


def test_a_completed_run_with_a_warned_step_reads_completed_with_warnings() -> None:
    summary = {"status": "completed", "steps": {"total": 2, "complete": 1, "complete_with_warning": 1}}
    assert run_state(summary) == "completed with warnings"
    allowed = {"status": "completed", "steps": {"total": 2, "complete": 1, "complete_with_error": 1}}
    assert run_state(allowed) == "completed with warnings"
    clean = {"status": "completed", "steps": {"total": 2, "complete": 2, "complete_with_warning": 0}}
    assert run_state(clean) == "completed"
    execution = {"status": "completed", "activities": [{"status": "complete"}, {"status": "complete_with_warning"}]}
    assert run_state(execution) == "completed with warnings"
    # A failed or running run is said as its status, whatever warned before.
    assert run_state({**execution, "status": "failed"}) == "failed"
    assert run_state({**execution, "status": "in_progress"}) == "running"
    assert run_state({"status": "cancelled", "activities": []}) == "cancelled"


@pytest.mark.parametrize(
    ("seconds", "words"),
    [(1, "1 s"), (900, "15 min"), (3600, "1 h"), (5400, "1 h 30 min"), (90005, "1 d 1 h 5 s"), (7200.5, "2 h 0.5 s")],
)
def test_a_deadline_s_length_is_said_exactly(seconds: float, words: str) -> None:
    # Unlike times.span's two units: "1 d 1 h" for 1 d 1 h 5 s would promise a deadline 5 s early.
    assert length_words(seconds) == words


def test_deadlines_and_alerts_in_people_s_words() -> None:
    deadlines = {"start_within": 900, "finish_within": 7200, "finish_by": "06:00"}
    assert deadline_words(deadlines, "Europe/London") == (
        "start within 15 min, finish within 2 h, finish by 06:00 Europe/London"
    )
    assert deadline_words({"finish_by": "22:30"}, "Asia/Kolkata") == "finish by 22:30 Asia/Kolkata"
    assert deadline_words(None, "UTC") is None and alert_words(None) is None
    assert alert_words({"channels": ["ops-pager", "ops-mail"], "on": ["failed", "late"]}) == (
        "failed, late → ops-pager, ops-mail"
    )
