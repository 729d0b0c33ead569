"""How the CLI shows states: pure functions, no Redis. Times: tests/test_times.py."""

from __future__ import annotations

from celeryapp.interfaces.terminal import bar_style


def test_a_group_with_a_failed_step_is_not_a_green_bar() -> None:
    assert bar_style(["complete", "complete"]) == "green"
    assert bar_style(["complete", "complete_with_warning"]) == "yellow"
    assert bar_style(["complete", "failed_with_error", "complete_with_warning"]) == "red"
    assert bar_style(["cancelled"]) == "red"
