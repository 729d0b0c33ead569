"""chordbeat: scheduled multi-step executions on Celery chords.

``celery -A celeryapp worker`` finds the application as ``celeryapp.app``. It is built from the
``CHORDBEAT_*`` environment on first access, not on import: a service that imports only
:mod:`celeryapp.client` gets no app built from its environment, no change to Celery's current app
and no signal receivers.
"""

from __future__ import annotations

import importlib
import sys
import threading
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from celeryapp.app import ChordbeatCelery, create_app

    app: ChordbeatCelery

__all__ = ["app", "create_app"]

_building = threading.Lock()


class _Package(types.ModuleType):
    """This package, whose ``app`` attribute stays the application once it is built.

    Python sets an imported submodule as an attribute of its package: importing the module
    ``celeryapp.app`` (``from celeryapp.app import ChordbeatCelery``) would otherwise hide the
    application behind the module, and ``from celeryapp import app`` would return the module.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "app" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


def __getattr__(name: str) -> Any:
    if name not in __all__:
        # Also how ``from celeryapp import keys`` learns it must import the submodule.
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # Imported on first use, not at the top: importing the package must build nothing. (By name:
    # ``from celeryapp import app`` would ask this function again.)
    app_module = importlib.import_module("celeryapp.app")
    if name == "create_app":
        return app_module.create_app
    with _building:
        built = globals().get("app")
        if built is None:
            built = app_module.create_app()
            globals()["app"] = built
    return built


sys.modules[__name__].__class__ = _Package
