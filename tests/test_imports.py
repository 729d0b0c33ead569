"""The import graph of celeryapp, tasks and models is acyclic, and imports are where a reader looks."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("celeryapp", "tasks", "models")
#: The layers, lowest first: a module imports its own part and the layers below, nothing above, and
#: nothing of another part of its own layer. ``docs/architecture.md`` shows this table.
LAYERS: tuple[dict[str, tuple[str, ...]], ...] = (
    {
        "base": (
            "celeryapp.errors",
            "celeryapp.config",
            "celeryapp.variables",
            "celeryapp.redis_urls",
            "celeryapp.context",
            "celeryapp.outcome",
            "models.states",
        )
    },
    {"domain": ("celeryapp.domain",)},
    {"storage": ("models",)},
    {"messaging": ("celeryapp.messaging",)},
    {"monitoring": ("celeryapp.monitoring",)},
    {"execution": ("celeryapp.execution",), "scheduling": ("celeryapp.scheduling",)},
    {"worker": ("celeryapp.worker",)},
    {"recovery": ("celeryapp.recovery",), "alerting": ("celeryapp.alerting",)},
    {"application": ("celeryapp.application", "celeryapp")},
    {"interfaces": ("celeryapp.interfaces", "celeryapp.client", "celeryapp.contract", "celeryapp.answer_shapes")},
    {"tasks": ("tasks",)},
)
#: Modules that import inside functions, and why.
LATE_IMPORTS = {
    f"celeryapp.interfaces.cli.{module}": "each command imports what it needs: `chordbeat health` stays small and quick"
    for module in ("calls", "files", "schedules", "runs", "backfills", "watch", "processes", "audit", "alerts")
}


def module_files() -> dict[str, Path]:
    files = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts:
                continue  # Alembic's scripts, run by Alembic, import nothing of ours but models
            parts = path.relative_to(ROOT).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            hidden |= {id(n) for n in ast.walk(node)}
    return hidden


def import_graph() -> dict[str, set[str]]:
    """Module → the modules of ours it imports at run time (``TYPE_CHECKING`` imports left out)."""
    files = module_files()
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        tree = ast.parse(path.read_text())
        hidden = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if id(node) in hidden:
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # ``from package import module`` imports the module (and runs the package's
                # ``__init__``, which imports nothing here); ``from module import name`` the module.
                modules = [f"{node.module}.{alias.name}" for alias in node.names]
                targets = [m for m in modules if m in files] or [node.module]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t in files and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        for target in sorted(graph[node]):
            cycle = visit(target, [*path, node])
            if cycle:
                return cycle
        done.add(node)
        return None

    for start in sorted(graph):
        cycle = visit(start, [])
        if cycle:
            return cycle
    return None


def part_of(module: str, layers: tuple[dict[str, tuple[str, ...]], ...] = LAYERS) -> tuple[int, str]:
    """(layer number, part name) of ``module``: the part with the longest prefix that contains it."""
    found = [
        (len(prefix), index, part)
        for index, parts in enumerate(layers)
        for part, prefixes in parts.items()
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    if not found:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS and docs/architecture.md")
    _, index, part = max(found)
    return index, part


def wrong_way_imports(graph: dict[str, set[str]], layers: tuple[dict[str, tuple[str, ...]], ...] = LAYERS) -> list[str]:
    wrong = []
    for module, targets in sorted(graph.items()):
        layer, part = part_of(module, layers)
        for target in sorted(targets):
            target_layer, target_part = part_of(target, layers)
            if target_layer > layer or (target_layer == layer and target_part != part):
                wrong.append(f"{module} ({part}) imports {target} ({target_part})")
    return wrong


def test_imports_only_go_down_the_layers() -> None:
    assert wrong_way_imports(import_graph()) == []


def test_a_wrong_way_import_is_found_and_named() -> None:
    graph = import_graph()
    graph["celeryapp.domain.cadence"].add("celeryapp.execution.runs")
    graph["celeryapp.execution.runs"].add("celeryapp.scheduling.store")
    graph["celeryapp.messaging.keys"].add("celeryapp.worker.dispatch")
    assert wrong_way_imports(graph) == [
        "celeryapp.domain.cadence (domain) imports celeryapp.execution.runs (execution)",
        "celeryapp.execution.runs (execution) imports celeryapp.scheduling.store (scheduling)",
        "celeryapp.messaging.keys (messaging) imports celeryapp.worker.dispatch (worker)",
    ]


def test_docs_architecture_shows_the_layers_as_the_test_checks_them() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:4] for line in section.splitlines() if line.startswith("| ")][1:]
    shown = [(layer.strip(), part.strip(), cell.strip()) for part, layer, cell in rows]
    expected = []
    for index, parts in reversed(list(enumerate(LAYERS))):
        for part, prefixes in parts.items():
            expected.append((str(index), part, ", ".join(f"`{p}`" for p in prefixes)))
    assert [(layer, part, cell.split(": ", 1)[0]) for layer, part, cell in shown] == expected


#: Lines a module may have: past it, a module holds more than one concept.
MAX_MODULE_LINES = 400


def test_no_module_is_over_400_lines() -> None:
    long = {
        name: lines
        for name, path in module_files().items()
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_every_package_is_installed() -> None:
    """pyproject.toml lists the packages a wheel or the image installs: one left out installs
    without it (setuptools only warns) and fails at its first import."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    packages = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for package in PACKAGES
        for init in (ROOT / package).rglob("__init__.py")
    }
    assert packages - listed == set()


def test_the_import_graph_is_acyclic() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, " → ".join(cycle or [])


def test_a_cycle_is_found_and_shown() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_imports_inside_functions_are_only_where_documented() -> None:
    late = set()
    for name, path in module_files().items():
        for function in ast.walk(ast.parse(path.read_text())):
            if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef) and any(
                isinstance(n, ast.Import | ast.ImportFrom) for n in ast.walk(function)
            ):
                late.add(name)
    assert late == set(LATE_IMPORTS)


def imported_packages(files: dict[str, Path]) -> list[str]:
    """The top-level packages, not ours, that ``files`` import."""
    found = set()
    for path in files.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module.split(".")[0])
    return sorted(found - {"__future__", *(name.split(".")[0] for name in files)})


def import_each_first(modules: list[str], preload: list[str], cwd: Path = ROOT) -> dict[str, str]:
    """Each of ``modules`` imported first in a child of one interpreter that imported only
    ``preload`` (tests/support/fresh_imports.py): module → its traceback, ``""`` when it imported."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.fresh_imports", ",".join(preload), *modules],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))},
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    errors: dict[str, str] = json.loads(done.stdout)
    return errors


@pytest.fixture(scope="module")
def fresh_import_errors() -> dict[str, str]:
    files = module_files()
    return import_each_first(sorted(files), imported_packages(files))


# The fixture imports every module once (about half a minute on a loaded 2-core machine), in the
# first of these tests.
@pytest.mark.timeout(300)
@pytest.mark.parametrize("module", sorted(module_files()))
def test_each_module_imports_on_its_own(module: str, fresh_import_errors: dict[str, str]) -> None:
    """What the graph cannot see (the package's lazy ``app``, say) fails here: each module imported
    first, in an interpreter where no module of ours was imported before."""
    assert fresh_import_errors[module] == ""


def test_an_import_that_works_only_after_another_fails_on_its_own(tmp_path: Path) -> None:
    """A planted order bug: ``planted.a`` imports ``planted.b``, which needs a name ``a`` defines
    only after that import. Imported after ``b`` in one interpreter, ``a`` works; each imported
    first, as the test above does, ``a`` fails and ``b`` works."""
    package = tmp_path / "planted"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("import planted.b\n\nNAME = 1\n")
    (package / "b.py").write_text("from planted.a import NAME\n")
    one_interpreter = subprocess.run(
        [sys.executable, "-c", "import planted.b, planted.a"], cwd=tmp_path, capture_output=True, check=False
    )
    assert one_interpreter.returncode == 0
    errors = import_each_first(["planted.b", "planted.a"], ["celery", "sqlalchemy"], cwd=tmp_path)
    assert errors["planted.b"] == ""
    assert "ImportError: cannot import name 'NAME' from partially initialized module 'planted.a'" in errors["planted.a"]
    with pytest.raises(AssertionError, match="imported modules of ours"):
        import_each_first(["planted.a"], ["planted"], cwd=tmp_path)


def borrowed_from_test_modules(path: Path) -> list[str]:
    """``path``'s imports of a test module or conftest, which only ``tests/support/`` should serve."""
    borrowed = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom) or not node.module:
            continue
        modules = [f"{node.module}.{alias.name}" for alias in node.names] if node.module == "tests" else [node.module]
        borrowed += [f"{path.name}: from {m}" for m in modules if m.startswith(("tests.test_", "tests.conftest"))]
    return borrowed


def test_test_modules_share_helpers_through_tests_support_not_through_each_other(tmp_path: Path) -> None:
    assert [line for path in sorted((ROOT / "tests").rglob("*.py")) for line in borrowed_from_test_modules(path)] == []
    planted = tmp_path / "test_planted.py"
    planted.write_text("from tests import test_flower\nfrom tests.test_cli import run\nfrom tests.support import lab\n")
    assert borrowed_from_test_modules(planted) == [
        "test_planted.py: from tests.test_flower",
        "test_planted.py: from tests.test_cli",
    ]
