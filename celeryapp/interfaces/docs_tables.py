"""The docs' tables of the contract, written from their one source.

``python -m celeryapp.interfaces.docs_tables`` rewrites each block between ``<!-- generated: NAME … -->`` and
``<!-- end generated: NAME -->``; ``--check`` prints the difference and fails when one is stale
(``tests/test_contract.py`` runs the check).
"""

from __future__ import annotations

import difflib
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

from celeryapp.contract import CALLER_ERRORS, SERVICE_TASKS, Param
from celeryapp.variables import VARIABLES

ROOT = Path(__file__).resolve().parents[2]
#: The files holding generated blocks.
FILES = ("docs/configuration.md", "docs/api.md")
_BLOCK = re.compile(
    r"(<!-- generated: (?P<name>[\w-]+)[^>]*-->\n)(?P<body>.*?)(<!-- end generated: (?P=name) -->)", re.S
)


def _param(param: Param) -> str:
    if param.required:
        return f"`{param.name}`"
    bounds = ", ".join(
        x for x in (f"default {json.dumps(param.default)}" if param.default is not None else "", param.note) if x
    )
    return f"`{param.name}` ({bounds or 'optional'})"


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def service_tasks() -> str:
    return _table(
        ("task name", "kwargs", "returns", "refusals besides `InvalidArgument`"),
        [
            (
                f"`{task.name}`",
                ", ".join(_param(p) for p in task.params) or "—",
                task.returns,
                ", ".join(f"`{e}`" for e in task.errors) or "—",
            )
            for task in SERVICE_TASKS
        ],
    )


def errors() -> str:
    return _table(
        ("`exc_type`", "a Python caller can catch", "raised when", "message"),
        [
            (
                f"`{e.exc_type}`",
                ", ".join(f"`{c}`" for c in ("ChordbeatError", e.builtin) if c),
                e.when,
                e.message,
            )
            for e in CALLER_ERRORS
        ],
    )


def variables() -> str:
    return _table(("variable", "default", "meaning"), [(f"`{v.name}`", v.default, v.meaning) for v in VARIABLES])


TABLES: dict[str, Callable[[], str]] = {"service-tasks": service_tasks, "errors": errors, "variables": variables}


def rendered(text: str) -> str:
    """``text`` with every generated block written afresh; an unknown block name is an error."""

    def block(match: re.Match[str]) -> str:
        return match.group(1) + TABLES[match.group("name")]() + match.group(4)

    return _BLOCK.sub(block, text)


def stale(root: Path = ROOT) -> str:
    """A unified diff of what rewriting the blocks would change; empty when all are current."""
    diff: list[str] = []
    for name in FILES:
        text = (root / name).read_text()
        diff += difflib.unified_diff(
            text.splitlines(True), rendered(text).splitlines(True), name, f"{name} (generated)"
        )
    return "".join(diff)


def main(argv: list[str]) -> int:
    if "--check" in argv:
        diff = stale()
        sys.stdout.write(diff)
        return 1 if diff else 0
    for name in FILES:
        path = ROOT / name
        path.write_text(rendered(path.read_text()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
