"""docs/security.md's tables with a `test` column are claims: each line names the tests that hold it.

A line that names no test, or a test that does not exist (renamed, deleted), is a claim nobody
checks any more; these tests make it fail CI instead.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SECURITY = ROOT / "docs" / "security.md"
TESTS = ROOT / "tests"

REFERENCE = re.compile(r"`((?:tests/)?test_\w+\.py)?(?:::(\w+)(?:\[[^\]]*\])?)?`")


@dataclass(frozen=True)
class Line:
    table: str
    first_cell: str
    test_cell: str


def table_lines(text: str) -> list[Line]:
    """Every body line of every Markdown table whose header has a `test` column."""
    lines: list[Line] = []
    heading = ""
    header: list[str] | None = None
    for raw in text.splitlines():
        if raw.startswith("#"):
            heading = raw.lstrip("# ").strip()
        if not raw.startswith("|"):
            header = None
            continue
        cells = [cell.strip() for cell in raw.strip().strip("|").split("|")]
        if header is None:
            header = [cell.lower() for cell in cells]
            continue
        if set(raw.replace("|", "").strip()) <= {"-", ":", " "}:
            continue
        if "test" in header and len(cells) == len(header):
            lines.append(Line(heading, cells[0], cells[header.index("test")]))
    return lines


@cache
def defined_tests(file: Path) -> frozenset[str]:
    tree = ast.parse(file.read_text(encoding="utf-8"))
    return frozenset(
        node.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test")
    )


def unbacked(line: Line) -> list[str]:
    """What is wrong with a line's test cell: no test named, or a named test that is not there."""
    problems: list[str] = []
    current: Path | None = None
    named = 0
    for match in REFERENCE.finditer(line.test_cell):
        file_name, function = match.groups()
        if file_name is None and function is None:
            continue
        if file_name is not None:
            current = TESTS / Path(file_name).name
            if not current.is_file():
                problems.append(f"{file_name}: no such test file")
                current = None
                continue
        if function is None:
            named += 1
            continue
        if current is None:
            problems.append(f"::{function}: no file named before it")
        elif function not in defined_tests(current):
            problems.append(f"{current.name}::{function}: no such test")
        else:
            named += 1
    if named == 0 and not problems:
        problems.append("names no test")
    return problems


LINES = table_lines(SECURITY.read_text(encoding="utf-8"))


def test_the_tables_with_a_test_column_are_found() -> None:
    tables = {line.table for line in LINES}
    assert "What each role can do" in tables
    assert "Hostile inputs tried" in tables


@pytest.mark.parametrize("line", LINES, ids=lambda line: f"{line.table[:20]}:{line.first_cell[:40]}")
def test_each_line_names_tests_that_exist(line: Line) -> None:
    assert unbacked(line) == []


def test_the_role_table_has_a_line_for_each_role() -> None:
    roles = [line.first_cell for line in LINES if line.table == "What each role can do"]
    for role in (
        "anonymous",
        "dashboard viewer",
        "dashboard admin",
        "Flower login",
        "broker caller",
        "Redis client",
        "schedule-file author",
        "step code",
    ):
        assert any(f"**{role}**" in cell for cell in roles), role


def test_the_hostile_input_catalogue_covers_every_finding_of_the_review() -> None:
    findings = {line.first_cell for line in LINES if line.table == "Hostile inputs tried"}
    assert findings >= {str(number) for number in range(1, 11)}


def test_a_line_naming_a_missing_test_or_none_is_reported() -> None:
    text = (
        "## Made up\n\n| claim | test |\n|---|---|\n"
        "| a | `test_web.py::test_pages_need_a_login`, `::test_no_such_thing` |\n"
        "| b | by reading |\n"
        "| c | `test_nowhere.py` |\n"
    )
    problems = [unbacked(line) for line in table_lines(text)]
    assert problems == [
        ["test_web.py::test_no_such_thing: no such test"],
        ["names no test"],
        ["test_nowhere.py: no such test file"],
    ]
