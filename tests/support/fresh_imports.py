"""Each module of ours imported first in an interpreter of its own, without paying for Python and
the third-party packages once per module.

Run as ``python -m tests.support.fresh_imports PRELOAD MODULE...`` (PRELOAD: comma-separated
top-level packages, not ours). The parent imports those packages, checks that none of ours came
with them, then forks one child per module: each child starts from that state and imports its
module, so our code is imported fresh and in its own order, as ``python -c "import module"``
would. Only top-level packages are preloaded, so a child sees what any fresh ``import celery``
gives, not a submodule another of our modules would have imported. Prints a JSON object:
module → the child's traceback, ``""`` when the import succeeded.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import sys
import traceback

#: Seconds a child may take to import its module (as the per-module interpreters had).
CHILD_TIMEOUT_S = 120


def preload(packages: list[str], ours: tuple[str, ...]) -> None:
    for package in packages:
        # A child that needs a package that failed here imports it again and reports the error.
        with contextlib.suppress(ImportError):
            importlib.import_module(package)
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in ours)
    if loaded:
        raise SystemExit(f"preloading {packages} imported modules of ours: {loaded}")


def import_in_child(module: str) -> str:
    """``module`` imported in a forked child; its traceback, or ``""``."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        os.dup2(2, 1)  # what a module prints goes to stderr, not into the JSON on stdout
        signal.alarm(CHILD_TIMEOUT_S)
        try:
            importlib.import_module(module)
            code = 0
        except BaseException:
            os.write(write_end, traceback.format_exc().encode())
            code = 1
        os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        error = pipe.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return error or f"killed by signal {os.WTERMSIG(status)} (SIGALRM: still importing after {CHILD_TIMEOUT_S} s)"
    return error or ("" if os.WEXITSTATUS(status) == 0 else f"exit status {os.WEXITSTATUS(status)}")


def main(argv: list[str]) -> None:
    packages, modules = argv[0].split(","), argv[1:]
    preload([p for p in packages if p], ours=tuple({m.split(".")[0] for m in modules}))
    json.dump({module: import_in_child(module) for module in modules}, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1:])
