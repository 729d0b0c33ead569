"""The import graph of celeryapp, tasks and models is acyclic, and imports are where a reader looks."""

from __future__ import annotations

import ast
import io
import json
import os
import re
import subprocess
import sys
import tokenize
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
            "celeryapp.runtime",
            "celeryapp.states",
            "celeryapp.clock_correction",
            "celeryapp.clock",
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
    for module in (
        "calls",
        "files",
        "schedules",
        "runs",
        "backfills",
        "watch",
        "processes",
        "audit",
        "alerts",
        "limits",
    )
}


def module_files(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    files = {}
    for package in packages:
        for path in (root / package).rglob("*.py"):
            if "migrations" in path.parts:
                continue  # Alembic's scripts, run by Alembic, import nothing of ours but models
            parts = path.relative_to(root).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def import_graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """Module → the modules of ours it imports, ``TYPE_CHECKING`` imports too: a circle closed by a
    type-only import is still a circle (a reader, and mypy, must go round it)."""
    files = module_files(root, packages)
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        graph[name] = imports_of(name, ast.parse(path.read_text()), set(files))
    return graph


def imports_of(name: str, tree: ast.AST, modules: set[str]) -> set[str]:
    """The modules of ours (among ``modules``) that the module ``name`` with source ``tree`` imports."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # ``from package import module`` imports the module (and runs the package's
            # ``__init__``, which imports nothing here); ``from module import name`` the module.
            named = [f"{node.module}.{alias.name}" for alias in node.names]
            targets = [m for m in named if m in modules] or [node.module]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            continue
        found |= {t for t in targets if t in modules and t != name}
    return found


def package_of(module: str, root: Path = ROOT) -> str:
    """The package ``module`` counts in: its own package (``celeryapp.domain``, ``models``, ``tasks``).
    The top of ``celeryapp`` is no package of its own but where the layers live: each of its modules
    (``celeryapp.errors``, ``celeryapp.application``) counts alone."""
    if (root / Path(*module.split(".")) / "__init__.py").exists():
        return module
    package = module.rsplit(".", 1)[0]
    return module if package == "celeryapp" else package


def package_graph(graph: dict[str, set[str]], root: Path = ROOT) -> dict[str, set[str]]:
    """Package → the packages its modules import (itself left out)."""
    packages: dict[str, set[str]] = {package_of(module, root): set() for module in graph}
    for module, targets in graph.items():
        source = package_of(module, root)
        packages[source] |= {package_of(target, root) for target in targets} - {source}
    return packages


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


def concept_rows(text: str) -> list[tuple[str, list[str]]]:
    """The rows of docs/architecture.md's "Where each concept lives": (concept, the modules named)."""
    section = text.split("## Where each concept lives", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:3] for line in section.splitlines() if line.startswith("| ")][1:]
    return [(concept.strip(), re.findall(r"`([^`]+)`", cell)) for concept, cell in rows]


def misplaced(rows: list[tuple[str, list[str]]], files: dict[str, Path]) -> list[str]:
    """What is wrong with the concept table: a module it names that does not exist, a module of
    ours in no row or in two (``package.*`` names a package's every module; a package whose
    ``__init__`` holds no code need not be placed)."""
    wrong = [
        f"{concept}: {name} does not exist"
        for concept, names in rows
        for name in names
        if name.removesuffix(".*") not in files
    ]
    rows_of: dict[str, list[str]] = {module: [] for module in files}
    for concept, names in rows:
        for name in names:
            package = name.removesuffix(".*")
            for module in files:
                if module == name or (name.endswith(".*") and (module == package or module.startswith(package + "."))):
                    rows_of[module].append(concept)
    for module, concepts in sorted(rows_of.items()):
        if not concepts and (files[module].name != "__init__.py" or code_lines(files[module].read_text())):
            wrong.append(f"{module} is in no row")
        elif len(concepts) > 1:
            wrong.append(f"{module} is in {len(concepts)} rows: {', '.join(concepts)}")
    return wrong


def test_docs_architecture_places_every_module_in_one_concept() -> None:
    assert misplaced(concept_rows((ROOT / "docs" / "architecture.md").read_text()), module_files()) == []


def test_a_module_out_of_the_concept_table_is_found_and_named(tmp_path: Path) -> None:
    rows = concept_rows((ROOT / "docs" / "architecture.md").read_text())
    files = module_files()
    files["celeryapp.execution.planted"] = tmp_path / "planted.py"
    rows.append(("planted", ["celeryapp.execution.runs", "celeryapp.execution.gone"]))
    assert misplaced(rows, files) == [
        "planted: celeryapp.execution.gone does not exist",
        "celeryapp.execution.planted is in no row",
        "celeryapp.execution.runs is in 2 rows: runs: start, overlap, end, cancel, re-run, planted",
    ]


#: Code lines a module may have (docstrings, comments and blank lines not counted): past it, a
#: module holds more than one concept. Past ``NOTE_MODULE_LINES`` lines in all, a note is printed.
MAX_CODE_LINES = 450
NOTE_MODULE_LINES = 600


def code_lines(source: str) -> int:
    """Lines holding code: not blank, not only a comment, not part of a docstring."""
    tree = ast.parse(source)
    docstrings: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                docstrings |= set(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    lines: set[int] = set()
    skipped = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skipped:
            lines |= set(range(token.start[0], token.end[0] + 1))
    return len(lines - docstrings)


def test_code_lines_leave_out_docstrings_comments_and_blank_lines() -> None:
    source = '''"""A module.

Its docstring.
"""

import os  # a comment

# a comment alone


def f() -> str:
    """Its docstring."""
    return """a string
that is code"""
'''
    assert code_lines(source) == 4


def test_no_module_is_over_450_code_lines(capsys: pytest.CaptureFixture[str]) -> None:
    long, noted = {}, {}
    for name, path in module_files().items():
        source = path.read_text()
        if (lines := code_lines(source)) > MAX_CODE_LINES:
            long[name] = lines
        if (total := len(source.splitlines())) > NOTE_MODULE_LINES:
            noted[name] = (total, lines)
    with capsys.disabled():
        for name, (total, lines) in sorted(noted.items()):
            print(f"\nnote: {name} has {total} lines ({lines} of code): is it still one concept?")
    assert long == {}


def _defined_names(tree: ast.Module, package: bool) -> set[str] | None:
    """Names ``tree``'s module defines itself (``None``: any, its ``__getattr__`` makes them). A
    package's ``__init__`` also serves the names its ``__all__`` lists: its public face."""
    names: set[str] = set()
    statements: list[ast.stmt] = list(tree.body)
    while statements:
        node = statements.pop()
        if isinstance(node, ast.If | ast.Try):
            statements += [*node.body, *node.orelse, *getattr(node, "finalbody", [])]
            statements += [s for handler in getattr(node, "handlers", []) for s in handler.body]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            if package and any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and node.value:
                names |= {
                    e.value for e in ast.walk(node.value) if isinstance(e, ast.Constant) and isinstance(e.value, str)
                }
    return None if "__getattr__" in names else names


def _all_of(tree: ast.Module) -> set[str]:
    """The names a module's ``__all__`` lists."""
    return {
        element.value
        for node in tree.body
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
        for element in ast.walk(node.value)
        if isinstance(element, ast.Constant) and isinstance(element.value, str)
    }


def borrowed_names(sources: dict[str, tuple[str, bool]]) -> list[str]:
    """``A imports X from B`` (or reads ``B.X``) where B does not define X but only imports it
    itself: X has one home, and its importers go there. ``sources``: module → (its text, whether
    it is a package)."""
    trees = {name: ast.parse(text) for name, (text, _) in sources.items()}
    defined = {name: _defined_names(tree, sources[name][1]) for name, tree in trees.items()}

    def borrowed_from(module: str, name: str) -> bool:
        own = defined[module]
        return own is not None and f"{module}.{name}" not in sources and name != "*" and name not in own

    borrowed = []
    for name, tree in sorted(trees.items()):
        listed = _all_of(tree)
        own = defined[name]
        if not sources[name][1] and own is not None:
            borrowed += [f"{name} lists {x} in __all__, which it only imports" for x in sorted(listed - own)]
        modules: dict[str, str] = {}  # local name → a module of ours it stands for
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module in defined:
                for alias in node.names:
                    if f"{node.module}.{alias.name}" in sources:
                        modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                    elif borrowed_from(node.module, alias.name):
                        borrowed.append(f"{name} imports {alias.name} from {node.module}, which only imports it")
            elif isinstance(node, ast.Import):
                modules |= {alias.asname: alias.name for alias in node.names if alias.asname and alias.name in sources}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
                module = modules[node.value.id]
                if borrowed_from(module, node.attr):
                    borrowed.append(f"{name} reads {node.attr} from {module}, which only imports it")
    return sorted(set(borrowed))


def _sources() -> dict[str, tuple[str, bool]]:
    return {name: (path.read_text(), path.name == "__init__.py") for name, path in module_files().items()}


def test_names_are_imported_from_the_module_that_defines_them() -> None:
    assert borrowed_names(_sources()) == []


def test_a_re_export_is_found_and_named() -> None:
    sources = _sources()
    runs, _ = sources["celeryapp.execution.runs"]
    planted_runs = runs + "\nfrom celeryapp.domain.cadence import Cadence, cadence_of\n__all__ = ['cadence_of']\n"
    sources["celeryapp.execution.runs"] = (planted_runs, False)
    sources["celeryapp.planted"] = ("from celeryapp.execution.runs import Cadence, start_execution\n", False)
    sources["celeryapp.planted_too"] = (
        "from celeryapp.execution import runs\nruns.Cadence\nruns.lock_schedule\n",
        False,
    )
    assert borrowed_names(sources) == [
        "celeryapp.execution.runs lists cadence_of in __all__, which it only imports",
        "celeryapp.planted imports Cadence from celeryapp.execution.runs, which only imports it",
        "celeryapp.planted_too reads Cadence from celeryapp.execution.runs, which only imports it",
    ]


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


def test_the_package_graph_is_acyclic() -> None:
    cycle = find_cycle(package_graph(import_graph()))
    assert cycle is None, " → ".join(cycle or [])


def test_a_cycle_is_found_and_shown() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def plant(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_circle_closed_only_by_type_imports_is_found(tmp_path: Path) -> None:
    type_only = "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from planted.{other} import Thing\n"
    plant(
        tmp_path,
        {
            "planted/__init__.py": "",
            "planted/first.py": type_only.format(other="second"),
            "planted/second.py": type_only.format(other="first"),
        },
    )
    assert find_cycle(import_graph(tmp_path, ("planted",))) == ["planted.first", "planted.second", "planted.first"]


def test_a_package_cycle_is_found_though_the_modules_make_no_circle(tmp_path: Path) -> None:
    """The shape of the state enums kept in ``models`` while the domain imported them: ``models``
    imports the domain, and the domain one of ``models``' modules that imports nothing back."""
    plant(
        tmp_path,
        {
            "planted/__init__.py": "",
            "planted/domain/__init__.py": "",
            "planted/domain/rules.py": "from planted.storage.states import State\n",
            "planted/storage/__init__.py": "",
            "planted/storage/states.py": "import enum\n",
            "planted/storage/tables.py": "from planted.domain.rules import decide\n",
        },
    )
    graph = import_graph(tmp_path, ("planted",))
    assert find_cycle(graph) is None
    assert find_cycle(package_graph(graph, tmp_path)) == ["planted.domain", "planted.storage", "planted.domain"]


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
