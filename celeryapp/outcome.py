"""How a step task reports something other than plain success without raising.

A step task fails by raising. To complete with a warning or an error, it returns one of these.
"""

from __future__ import annotations

import json
from typing import Any

from celeryapp.states import ActivityStatus

OUTCOME_KEY = "chordbeat_outcome"


def warning(message: str) -> dict[str, Any]:
    """Return this from a step task to record ``complete_with_warning``."""
    return {OUTCOME_KEY: ActivityStatus.COMPLETE_WITH_WARNING.value, "message": message}


def error(message: str) -> dict[str, Any]:
    """Return this to record ``complete_with_error`` (stops the run unless continue_on_failure)."""
    return {OUTCOME_KEY: ActivityStatus.COMPLETE_WITH_ERROR.value, "message": message}


def completed(message: str) -> dict[str, Any]:
    """Return this to complete normally with ``message`` kept on the activity."""
    return {OUTCOME_KEY: ActivityStatus.COMPLETE.value, "message": message}


def classify(result: Any) -> tuple[ActivityStatus, str | None]:
    """The activity status and message a step's return value stands for."""
    if isinstance(result, dict) and OUTCOME_KEY in result:
        try:
            status = ActivityStatus(result[OUTCOME_KEY])
        except ValueError:
            return ActivityStatus.COMPLETE_WITH_ERROR, f"unknown outcome {result[OUTCOME_KEY]!r}"
        message = result.get("message")
        return status, None if message is None else str(message)
    return ActivityStatus.COMPLETE, summarize(result)


#: Characters of a step's return value kept on its activity.
SUMMARY_CHARS = 500


def summarize(result: Any) -> str | None:
    """A step's return value as people read it: JSON (``{"slept": 0.05}``, as the payload and the
    API show values), or Python's repr for a value JSON cannot say; cut to ``SUMMARY_CHARS``."""
    if result is None:
        return None
    try:
        text = json.dumps(result, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        text = repr(result)
    return text if len(text) <= SUMMARY_CHARS else text[: SUMMARY_CHARS - 3] + "..."
