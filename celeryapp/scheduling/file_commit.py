"""The commit a schedule file was read at, when it is in a git repository: a definition version
made from the file names it (docs/versions.md)."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

logger = logging.getLogger(__name__)

#: Longest wait for git: a version without its commit beats an apply held up.
GIT_TIMEOUT_S = 10.0
#: Marks a commit id whose file differed from the committed one when it was read.
DIRTY = "-dirty"


def file_commit(path: str | Path) -> str | None:
    """``git rev-parse HEAD`` of the repository holding ``path`` (with :data:`DIRTY` when the file
    has changes not committed); None when it is in none, or git is missing or fails."""
    where = Path(path).resolve()
    try:
        head = _git(where.parent, "rev-parse", "HEAD")
        if head is None:
            return None
        changes = _git(where.parent, "status", "--porcelain", "--", where.name)
    except (OSError, subprocess.SubprocessError) as exc:
        logger.info("no commit id for %s: %s", path, exc)
        return None
    return head + (DIRTY if changes else "")


def _git(directory: Path, *args: str) -> str | None:
    # No fsmonitor: a repository's own config could name a program for git status to run.
    done = subprocess.run(
        ["git", "-c", "core.fsmonitor=false", "-C", str(directory), *args],
        capture_output=True,
        text=True,
        timeout=GIT_TIMEOUT_S,
        check=False,
    )
    return done.stdout.strip() if done.returncode == 0 else None
