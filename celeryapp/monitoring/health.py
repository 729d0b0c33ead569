"""Liveness files: worker and beat write a timestamp each loop; ``chordbeat health`` reads it.

A liveness file at a fixed name in a directory others can write to (``/tmp``) could be planted,
swapped for a symlink or kept fresh by someone else. So the files go straight into the configured
directory only when no one but its owner (us or root) can write there; otherwise into a private
``chordbeat-<uid>`` subdirectory (mode 0700, ours, not a symlink). Every access goes through a
file descriptor of the checked directory, so renaming things around it afterwards changes nothing.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from celeryapp.config import Settings
from celeryapp.errors import ChordbeatError

logger = logging.getLogger(__name__)

#: Seconds after which a worker whose file was not touched counts as stalled (beat's limit is a
#: setting: past it, beat's watchdog ends it).
WORKER_STALE_AFTER_S = 60.0
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
_warned: set[str] = set()


class UnsafeHealthDir(ChordbeatError):
    """Raised when the liveness directory could be tampered with by another user."""


def _owned_by_us_or_root(info: os.stat_result) -> bool:
    return info.st_uid in {os.geteuid(), 0}


def _writable_by_others(info: os.stat_result) -> bool:
    return bool(info.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def _open_private(parent_fd: int, name: str) -> int:
    """Open (creating it if missing) our own 0700 subdirectory of ``parent_fd``."""
    with suppress(FileExistsError):
        os.mkdir(name, 0o700, dir_fd=parent_fd)
    try:
        fd = os.open(name, _OPEN_DIR, dir_fd=parent_fd)
    except OSError as exc:  # ELOOP: a symlink was planted under our name
        raise UnsafeHealthDir(f"{name}: cannot open as a directory ({exc.strerror})") from None
    info = os.fstat(fd)
    if info.st_uid != os.geteuid() or info.st_mode & 0o077:
        os.close(fd)
        raise UnsafeHealthDir(f"{name}: owned by uid {info.st_uid} with mode {info.st_mode & 0o777:o}; not ours")
    return fd


@contextmanager
def _directory(settings: Settings) -> Iterator[int]:
    """A file descriptor of the directory the liveness files live in."""
    base = os.path.abspath(settings.health_dir)
    fd = os.open(base, _OPEN_DIR)
    try:
        info = os.fstat(fd)
        if not _owned_by_us_or_root(info):
            raise UnsafeHealthDir(f"{base}: owned by uid {info.st_uid}, not by this user or root")
        if _writable_by_others(info):
            private = _open_private(fd, f"chordbeat-{os.geteuid()}")
            os.close(fd)
            fd = private
        yield fd
    finally:
        os.close(fd)


def _file_name(process: str) -> str:
    return f"chordbeat-{process}.health"


def touch(settings: Settings, process: str) -> None:
    name = _file_name(process)
    try:
        with _directory(settings) as directory:
            tmp = f"{name}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600, dir_fd=directory)
            with os.fdopen(fd, "w") as out:
                out.write(f"{time.time():.3f}\n")
            os.replace(tmp, name, src_dir_fd=directory, dst_dir_fd=directory)
    except (OSError, UnsafeHealthDir) as exc:
        # A read-only or full disk must not stop the loop; the health check will say so.
        reason = str(exc)
        if reason not in _warned:
            _warned.add(reason)
            logger.warning("liveness file %s not written: %s", name, reason)


def remove(settings: Settings, process: str) -> None:
    """Forget ``process``'s liveness: a process that stopped cleanly is not alive, however recent
    its last touch."""
    name = _file_name(process)
    try:
        with _directory(settings) as directory:
            os.unlink(name, dir_fd=directory)
    except FileNotFoundError:
        pass
    except (OSError, UnsafeHealthDir) as exc:
        logger.warning("liveness file %s not removed: %s", name, exc)


def stale_after_s(settings: Settings, process: str) -> float:
    """Seconds without a touch after which ``process`` counts as stalled."""
    return settings.beat_stall_s if process == "beat" else WORKER_STALE_AFTER_S


def age_s(settings: Settings, process: str) -> float | None:
    """Seconds since ``process`` last touched its file; ``None`` if there is none (or it is unsafe)."""
    try:
        with _directory(settings) as directory:
            return time.time() - os.stat(_file_name(process), dir_fd=directory, follow_symlinks=False).st_mtime
    except (OSError, UnsafeHealthDir):
        return None


def problem(settings: Settings) -> str | None:
    """Why liveness files cannot be kept in the configured directory, if they cannot."""
    try:
        with _directory(settings):
            return None
    except (OSError, UnsafeHealthDir) as exc:
        return str(exc)
