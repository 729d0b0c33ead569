"""A step that says which environment variables its process sees, by name only (never a value),
loaded by subprocess workers (``CHORDBEAT_TASK_MODULES=tests.support.environment_tasks``)."""

from __future__ import annotations

import json
import os
from typing import Any

from celeryapp import app, outcome


@app.task(name="envcheck.visible")
def visible(names: list[str]) -> dict[str, Any]:
    return outcome.completed(json.dumps({name: name in os.environ for name in names}))
