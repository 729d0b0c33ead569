"""One-off: split celeryapp/lifecycle.py into modules by concept (issue 12.2), as a pure move.

Re-runnable on any later lifecycle.py: every top-level definition must be named in MODULES (the
script stops on one it does not know), private names used across modules lose their underscore,
importers are rewritten, then ``ruff check --fix`` drops unused imports. Run from the repository
root::

    python scripts/split_lifecycle.py
    ruff check --fix -q --config 'lint.isort.split-on-trailing-comma=false' \
        celeryapp/{effects,runs,steps,advancing,repair}.py
    ruff check --fix -q . && ruff format -q .

Delete this script once the split is merged.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "celeryapp" / "lifecycle.py"

CAS = (
    "Every state change is a compare-and-set ``UPDATE ... WHERE <expected state>``: whoever loses a\n"
    "race (a redelivered message, a second callback, recovery racing a slow worker) changes nothing.\n"
    "Functions here only touch the database and return the :class:`~celeryapp.effects.Effects` to\n"
    "send once the transaction has committed; :mod:`celeryapp.dispatch` sends them.\n"
)
MODULES: dict[str, tuple[str, list[str]]] = {
    "effects": (
        "What a change in the database leaves to do once its transaction commits: chords to send,\n"
        "runs to stop, messages to revoke, beat entries to rewrite. :mod:`celeryapp.dispatch` does it.\n",
        ["StepDispatch", "GroupDispatch", "Effects"],
    ),
    "runs": (
        "An execution's start and end in the database: the overlap policy applied, cancelling, and the\n"
        "schedule's bookkeeping when a run ends (counters, repeats, retries).\n\n"
        "Start and end share this module because each leads to the other: ``cancel_previous`` ends the\n"
        "active runs as a new one starts, and an ending run starts the retry or the buffered run that\n"
        "waited for it.\n\n" + CAS,
        [
            "StartResult",
            "run_key",
            "lock_schedule",
            "_active_execution_ids",
            "SlotOwner",
            "record_slot",
            "start_execution",
            "_overlapped",
            "_finish_execution",
            "_after_execution",
            "_pending_retry_started",
            "_apply_after",
            "_log_after",
            "cancel_execution",
        ],
    ),
    "steps": (
        "A step attempt in the database: a runner claims it (``queued`` → ``processing``, its activity\n"
        "opened) and finishes it (its activity closed, its worker task deleted).\n\n" + CAS,
        [
            "_spec_of",
            "Claim",
            "_of_run",
            "_CLAIM",
            "_OPEN_ACTIVITY",
            "_CLOSE_ACTIVITY",
            "_DROP_TASK",
            "claim_step",
            "finish_step",
        ],
    ),
    "advancing": (
        "After a step group: the execution fails, moves to its next group, or completes\n"
        "(:func:`celeryapp.decisions.decide_after_group` decides).\n\n" + CAS,
        ["_latest_results", "advance_execution", "_queued_group"],
    ),
    "repair": (
        "What recovery repairs: a lost attempt run again (or its step failed), a queued attempt whose\n"
        "message is gone sent again.\n\n" + CAS,
        ["requeue_attempt", "resend_queued"],
    ),
}
#: Moved elsewhere than a new module: the option goes beside ``affected`` in models.session.
ELSEWHERE = {"_NO_SYNC": "models.session"}
RENAMED = {"_finish_execution": "finish_execution", "_spec_of": "spec_of", "_NO_SYNC": "NO_SYNC"}
BANNER = re.compile(r"^# --- .* -+$")
IMPORTERS = ("celeryapp", "tasks", "models", "tests", "bench", "examples")


def _name(node: ast.stmt) -> str:
    if isinstance(node, ast.FunctionDef | ast.ClassDef):
        return node.name
    if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    raise SystemExit(f"line {node.lineno}: cannot place a {type(node).__name__}")


def _renamed(text: str) -> str:
    for old, new in RENAMED.items():
        text = re.sub(rf"\b{re.escape(old)}\b", new, text)
    return text


def split() -> dict[str, str]:
    source = SOURCE.read_text()
    lines = source.split("\n")
    tree = ast.parse(source)
    imports = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    import_block = "\n".join(lines[imports[0].lineno - 1 : imports[-1].end_lineno])
    import_block = "\n".join(line for line in import_block.split("\n") if line != "from __future__ import annotations")
    home = {name: module for module, (_, names) in MODULES.items() for name in names}
    segments: dict[str, list[str]] = {module: [] for module in MODULES}
    previous_end = imports[-1].end_lineno or 0
    for node in tree.body:
        if node in imports or (isinstance(node, ast.Expr) and node.lineno == 1):
            continue
        start, end = node.lineno - 1, node.end_lineno or node.lineno
        chunk = [line for line in lines[previous_end:end] if not BANNER.match(line)]
        previous_end = end
        name = _name(node)
        if name == "logger":
            continue
        if name in ELSEWHERE:
            continue
        if name not in home:
            raise SystemExit(f"{name} (line {start + 1}) is not placed: add it to MODULES")
        segments[home[name]].append("\n".join(chunk).strip("\n"))
    out = {}
    defined = {RENAMED.get(n, n): m for n, m in home.items()}
    for module, (doc, _) in MODULES.items():
        body = _renamed("\n\n\n".join(segments[module]))
        used = set(re.findall(r"\b\w+\b", body))
        cross: dict[str, set[str]] = {}
        for name, where in defined.items():
            if where != module and name in used:
                cross.setdefault(f"celeryapp.{where}", set()).add(name)
        if "NO_SYNC" in used:
            cross.setdefault("models.session", set()).add("NO_SYNC")
        cross_lines = "\n".join(f"from {m} import {', '.join(sorted(n))}" for m, n in sorted(cross.items()))
        logger = "\nlogger = logging.getLogger(__name__)\n" if "logger." in body else ""
        out[module] = (
            f'"""{doc.rstrip()}\n"""\n\nfrom __future__ import annotations\n\n{import_block}\n{cross_lines}\n'
            f"{logger}\n\n{body}\n"
        )
    return out


def rewrite_importers(home: dict[str, str]) -> None:
    pattern = re.compile(r"^(?P<indent>[ \t]*)from celeryapp\.lifecycle import (?P<names>\([^)]*\)|[^\n]+)", re.M)
    for folder in IMPORTERS:
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text()
            if "celeryapp.lifecycle" not in text:
                continue

            def replace(match: re.Match[str], path: Path = path) -> str:
                indent = match["indent"]
                names = [n.strip() for n in match["names"].strip("()").replace("\n", " ").split(",") if n.strip()]
                by_module: dict[str, list[str]] = {}
                for entry in names:
                    original, _, alias = entry.partition(" as ")
                    new = RENAMED.get(original.strip(), original.strip())
                    module = home.get(new)
                    if module is None:
                        raise SystemExit(f"{path}: {original} is not placed")
                    by_module.setdefault(module, []).append(f"{new} as {alias.strip()}" if alias else new)
                return "\n".join(
                    f"{indent}from celeryapp.{module} import {', '.join(entries)}"
                    for module, entries in sorted(by_module.items())
                )

            text = pattern.sub(replace, text)
            if "celeryapp.lifecycle" in text or re.search(r"\blifecycle\.\w", text.replace("tests.test_lifecycle", "")):
                print(f"{path}: still mentions lifecycle; check it by hand", file=sys.stderr)
            path.write_text(text)


def main() -> None:
    modules = split()
    home = {RENAMED.get(n, n): m for m, (_, names) in MODULES.items() for n in names}
    for module, text in modules.items():
        (ROOT / "celeryapp" / f"{module}.py").write_text(text)
    session = ROOT / "models" / "session.py"
    if "NO_SYNC" not in session.read_text():
        session.write_text(
            session.read_text().rstrip("\n")
            + "\n\n\n#: Execution option of bulk statements whose rows the session does not hold: nothing to sync.\n"
            'NO_SYNC = {"synchronize_session": False}\n'
        )
    rewrite_importers(home)
    SOURCE.unlink()


if __name__ == "__main__":
    main()
