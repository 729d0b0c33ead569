"""Celery's own worker-log line for a step runner's end, made to say what the step did.

A runner always returns normally (a failed chord header would fail its body, the advancement:
step_events.py), so Celery logs every step as ``Task <schedule>/<step>[id] succeeded in 0.1s:
{'status': 'failed_with_error', ...}``. The task's state cannot be FAILURE without breaking the
chord, but the log line is only a log record: this filter on Celery's ``celery.app.trace`` logger
rewrites that record for a step that failed (a WARNING: ``... ran in 0.1s: its step FAILED: ...``)
or was cancelled, before any handler sees it. Every other task's line is left as it is.
"""

from __future__ import annotations

import logging
from typing import Any

from celeryapp.domain.names import PREFIX
from celeryapp.worker.step_events import event_for

#: The logger Celery's tracer writes its success lines to.
TRACE_LOGGER = "celery.app.trace"
FAILED_LINE = "Task %(name)s[%(id)s] ran in %(runtime)ss: its step FAILED: %(return_value)s"
CANCELLED_LINE = "Task %(name)s[%(id)s] ran in %(runtime)ss: its step was CANCELLED: %(return_value)s"


class StepOutcomeLine(logging.Filter):
    """Rewrites Celery's ``succeeded`` line of a runner whose step failed or was cancelled."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = record.args
        if not isinstance(context, dict) or "succeeded in" not in str(record.msg):
            return True
        if not str(context.get("id", "")).startswith(_RUNNER_ID_PREFIX):
            return True
        kind, _ = event_for(context.get("return_value"))
        if kind == "task-failed":
            record.msg, record.levelno = FAILED_LINE, logging.WARNING
        elif kind == "task-revoked":
            record.msg = CANCELLED_LINE
        record.levelname = logging.getLevelName(record.levelno)
        return True


#: How a runner's task id starts (:func:`celeryapp.domain.names.runner_task_id`).
_RUNNER_ID_PREFIX = f"{PREFIX}-e"
_INSTALLED = StepOutcomeLine()


def install(**_: Any) -> None:
    """Put the filter on Celery's tracer logger (once; pool processes forked later inherit it)."""
    trace = logging.getLogger(TRACE_LOGGER)
    if _INSTALLED not in trace.filters:
        trace.addFilter(_INSTALLED)
