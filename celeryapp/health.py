"""Liveness files: worker and beat write a timestamp each loop; ``chordbeat health`` reads it."""

from __future__ import annotations

import os
import time
from pathlib import Path

from celeryapp.config import Settings

#: Seconds after which a process whose file was not touched counts as stalled (JIM's thresholds).
STALE_AFTER_S = {"worker": 60.0, "beat": 120.0}


def path_of(settings: Settings, process: str) -> Path:
    return Path(settings.health_dir) / f"chordbeat-{process}.health"


def touch(settings: Settings, process: str) -> None:
    path = path_of(settings, process)
    try:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(f"{time.time():.3f}\n")
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only or full disk must not stop the loop; the health check will say so


def age_s(settings: Settings, process: str) -> float | None:
    try:
        return time.time() - path_of(settings, process).stat().st_mtime
    except OSError:
        return None
