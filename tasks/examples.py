"""Example step tasks for demos and tests."""

from __future__ import annotations

import time
from typing import Any

from celeryapp import app, outcome
from celeryapp.errors import StepError


class StepFailed(StepError):
    """Raised by the ``fail`` example step."""


@app.task(name="chordbeat.examples.sleep")
def sleep(seconds: float = 1.0) -> dict[str, Any]:
    """Sleeps, then completes. Sleeps in short slices so a cancel stops it promptly."""
    deadline = time.monotonic() + float(seconds)
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.1))
    return {"slept": seconds}


@app.task(name="chordbeat.examples.fail")
def fail(message: str = "failed on purpose") -> None:
    """Fails the step with ``message``."""
    raise StepFailed(message)


@app.task(name="chordbeat.examples.warn")
def warn(message: str = "completed with a warning") -> dict[str, Any]:
    """Completes with a warning."""
    return outcome.warning(message)
