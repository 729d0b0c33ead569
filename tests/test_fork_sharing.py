"""What a prefork worker loads before its pool forks is shared with the pool processes."""

from __future__ import annotations

import subprocess
import sys

from tests.support.processes import ROOT

_PROBE = """
import gc, sys
from types import SimpleNamespace
from celeryapp import app
from celeryapp.recovery.signals import freeze_before_fork
before = "psycopg" in sys.modules
freeze_before_fork(SimpleNamespace(app=app, pool_cls="prefork"))
print(before, "psycopg" in sys.modules, gc.get_freeze_count() > 0)
"""


def _probe(database_url: str) -> list[str]:
    env = {"PYTHONPATH": ROOT, "CHORDBEAT_DATABASE_URL": database_url, "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=True)
    return done.stdout.split()


def test_the_postgresql_driver_is_loaded_before_the_pool_forks() -> None:
    # Nothing connects: the URL's server need not exist.
    assert _probe("postgresql+psycopg://nobody@127.0.0.1:1/nothing") == ["False", "True", "True"]


def test_a_sqlite_worker_loads_no_other_driver() -> None:
    assert _probe("sqlite:////tmp/chordbeat-fork-sharing.db") == ["False", "False", "True"]
