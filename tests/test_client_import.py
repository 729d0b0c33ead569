"""Importing the client inside another service changes nothing in that service's process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def run_python(code: str, **env: str) -> dict[str, Any]:
    """Runs ``code`` in a fresh interpreter (nothing imported yet) and returns what it printed as JSON."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CHORDBEAT_")}
    environ.update(env, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=environ,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_importing_the_client_builds_no_app_sets_no_current_app_and_connects_no_receiver() -> None:
    # Given a caller whose environment would not even make a valid chordbeat configuration
    seen = run_python(
        """
        import json, sys
        from celery import _state
        from celery.signals import worker_ready

        import celeryapp.client
        from celeryapp.client import ChordbeatClient

        client = ChordbeatClient("redis://127.0.0.1:1/0")
        print(json.dumps({
            "current_app": _state._tls.current_app is None,
            "default_app": _state.default_app is None,
            "receivers": len(worker_ready.receivers),
            "modules": sorted(m for m in sys.modules if m.split(".")[0] in {"celeryapp", "tasks", "models"}),
        }))
        """,
        CHORDBEAT_STEP_KINDS="not-a-kind",
    )
    # I expect nothing built, nothing made current, nothing connected, nothing else imported but
    # the contract (calls and answers' shapes), the pure redaction the client's task reprs share with the workers, the
    # reference clock's correction its calls' expiry is reckoned by, and the errors its refusal is one of
    # (standard library only)
    assert seen == {
        "current_app": True,
        "default_app": True,
        "receivers": 0,
        "modules": [
            "celeryapp",
            "celeryapp.answer_shapes",
            "celeryapp.client",
            "celeryapp.clock_correction",
            "celeryapp.contract",
            "celeryapp.domain",
            "celeryapp.domain.redaction",
            "celeryapp.errors",
        ],
    }


def test_a_caller_apps_worker_ready_reaches_only_its_own_receiver() -> None:
    seen = run_python(
        """
        import json, logging
        from celery import Celery
        from celery.signals import worker_ready

        logged = []

        class Keep(logging.Handler):
            def emit(self, record):
                logged.append(record.getMessage())

        class Consumer:  # what Celery sends worker_ready with: the worker's consumer
            app = None
            hostname = "caller@host"

        logging.getLogger().addHandler(Keep())
        caller = Celery("caller", set_as_current=True)
        calls = []
        worker_ready.connect(lambda sender=None, **_: calls.append(sender.hostname), weak=False)

        from celeryapp.client import ChordbeatClient

        ChordbeatClient(app=caller)
        Consumer.app = caller
        answers = worker_ready.send(sender=Consumer())
        from celery import _state
        print(json.dumps({
            "calls": calls,
            "receivers": len(answers),
            "logged": logged,
            "current_is_caller": _state.get_current_app() is caller,
        }))
        """
    )
    assert seen == {"calls": ["caller@host"], "receivers": 1, "logged": [], "current_is_caller": True}


def test_the_application_is_still_found_where_celery_looks_for_it() -> None:
    seen = run_python(
        """
        import json
        from celery.app.utils import find_app
        from celeryapp.application import ChordbeatCelery  # the module first: the package must still give the app

        import celeryapp
        from celeryapp import app

        print(json.dumps({
            "found": find_app("celeryapp") is app,
            "is_app": isinstance(app, ChordbeatCelery),
            "same": celeryapp.app is app,
        }))
        """
    )
    assert seen == {"found": True, "is_app": True, "same": True}
