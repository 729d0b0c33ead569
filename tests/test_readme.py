"""The README's first step works as written: a newcomer's first contact must not be rotten."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celeryapp.application import ChordbeatCelery
from tests.helpers import call, finished

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_readmes_first_step_runs_as_written(
    app: ChordbeatCelery, client: Celery, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    text = README.read_text()
    code = re.search(r"```python\n(# hr/steps.py\n.*?)```", text, re.S)
    assert code, "the README shows the first step's module"
    (tmp_path / "hr").mkdir()
    (tmp_path / "hr" / "__init__.py").write_text("")
    (tmp_path / "hr" / "steps.py").write_text(code.group(1))
    assert "CHORDBEAT_TASK_MODULES=hr.steps" in text and "chordbeat run nightly-hr-sync --wait" in text
    sys.path.insert(0, str(tmp_path))
    try:
        importlib.import_module("hr.steps")  # what CHORDBEAT_TASK_MODULES makes every worker do
        request.getfixturevalue("worker")
        step = re.search(r"`(\{name: \"HR import\".*?\})`", text)
        assert step, "the README shows the step's entry in a schedule"
        steps: list[Any] = [
            {"name": "HR import", "task": "hr.import_people", "kwargs": {"full": True}},
            {"name": "partial", "task": "hr.import_people", "kwargs": {"full": False}},
        ]
        definition = {"name": "nightly-hr-sync", "every": 3600, "payload": {"initiator": "hr"}, "steps": steps}
        call(client, "chordbeat.apply_schedule", definition=definition)
        run = finished(client, call(client, "chordbeat.trigger_schedule", name="nightly-hr-sync")["execution_id"])
        assert run["status"] == "completed", run
        assert [a["status"] for a in run["activities"]] == ["complete", "complete_with_warning"]
        assert run["activities"][1]["message"] == "partial import only"
    finally:
        sys.path.remove(str(tmp_path))
        for name in ("hr.steps", "hr"):
            sys.modules.pop(name, None)
        app.tasks.pop("hr.import_people", None)
