"""The app the layers below are handed is a :class:`Runtime` (mypy checks it in application.py)."""

from __future__ import annotations

from redbeat.schedulers import ensure_conf

from celeryapp.application import ChordbeatCelery
from celeryapp.runtime import Runtime


def test_the_app_is_a_runtime(app: ChordbeatCelery) -> None:
    ensure_conf(app)  # RedBeat's configuration, set before beat_entries and lost_slots read it
    assert isinstance(app, Runtime)
    assert app.redbeat_conf.schedule_key.startswith(app.redbeat_conf.key_prefix)
    assert "chordbeat.run_step" in app.tasks


def test_an_object_without_the_settings_is_no_runtime() -> None:
    class Bare:
        def now(self) -> None: ...

    assert not isinstance(Bare(), Runtime)
