"""chordbeat: scheduled multi-step executions on Celery chords.

``celery -A celeryapp worker`` finds the application as ``celeryapp.app``. It is built from the
``CHORDBEAT_*`` environment on first access, not on import: a service that imports only
:mod:`celeryapp.client` gets no app built from its environment, no change to Celery's current app
and no signal receivers.
"""

from __future__ import annotations

import importlib
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from celeryapp.application import ChordbeatCelery, create_app

    app: ChordbeatCelery

__all__ = ["app", "create_app"]

_building = threading.Lock()


def __getattr__(name: str) -> Any:
    if name not in __all__:
        # Also how ``from celeryapp import keys`` learns it must import the submodule.
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # Imported on first use, not at the top: importing the package must build nothing. (By name:
    # ``from celeryapp import app`` would ask this function again.)
    app_module = importlib.import_module("celeryapp.application")
    if name == "create_app":
        return app_module.create_app
    with _building:
        built = globals().get("app")
        if built is None:
            built = app_module.create_app()
            globals()["app"] = built
    return built
