"""Step tasks for the CLI's tests, registered in the in-process worker by importing this module."""

from __future__ import annotations

import logging

from celeryapp import app
from tasks.examples import StepFailed

logger = logging.getLogger(__name__)


def _deeper(depth: int, message: str) -> None:
    if depth:
        _deeper_still(depth - 1, message)
    raise StepFailed(message)


def _deeper_still(depth: int, message: str) -> None:
    # Two functions calling each other: Python would fold one calling itself into one line.
    _deeper(depth, message)


@app.task(name="tests.cli.noisy_fail")
def noisy_fail(lines: int = 30, depth: int = 15, message: str = "gave up") -> None:
    """Logs ``lines`` numbered lines, then fails ``depth`` calls deep: a long log and traceback."""
    for number in range(1, lines + 1):
        logger.warning("log line %d of %d", number, lines)
    _deeper(depth, message)
