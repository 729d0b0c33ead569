"""A schedule file's YAML mistakes in a person's words: where, what, and the line itself.

PyYAML's own message names its classes and internal states ("while scanning a simple key",
"<block end>") and points at where it gave up, often the line after the mistake. An operator
gets ``line L, column C: <problem>`` at the mistake, then that line with a caret under it.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from yaml.reader import ReaderError

#: Characters of the offending line shown around the caret: the excerpt stays within 80 columns.
EXCERPT_CHARS = 60
#: PyYAML's problems said plainly: (its problem matched from the start, where the mistake is,
#: the words). "context" marks where the construct PyYAML was reading began, "problem" where it
#: gave up; ``\\1`` is the problem's first group.
PLAIN_WORDS: tuple[tuple[re.Pattern[str], str, str], ...] = tuple(
    (re.compile(pattern), where, words)
    for pattern, where, words in (
        (r"could not find expected ':'", "context", "expected ':' after a key (write 'key: value')"),
        (r"mapping values are not allowed here", "problem", "a second ':' on one line; quote a value holding ': '"),
        (r"found character '\\t' that cannot start any token", "problem", "a tab; YAML is indented with spaces"),
        (r"found unexpected end of stream", "context", "a quoted value is never closed"),
        (r"expected ',' or '\]', but got '<stream end>'", "context", "a '[' is never closed with ']'"),
        (r"expected ',' or '\}', but got '<stream end>'", "context", "a '{' is never closed with '}'"),
        (r"expected <block end>, but found '\?'", "problem", "a key where the list above goes on (indentation?)"),
        (r"expected <block end>, but found", "problem", "indented differently from the lines above it"),
        (r"could not determine a constructor for the tag '([^']*)'", "problem", "the tag \\1 is not allowed"),
    )
)
#: PyYAML's names of what it read, in the problems the table above does not word.
TOKEN_WORDS = {"<stream end>": "the end of the file", "<block end>": "the end of the block"}


def yaml_problem(exc: yaml.YAMLError | ValueError, text: str) -> str:
    """``line L, column C: <problem>`` and the line with a caret, for a YAML error of ``text``."""
    if isinstance(exc, ReaderError):
        line, column = _place(text, exc.position)
        what = f"the character U+{exc.character:04X} is not allowed in YAML" if isinstance(exc.character, int) else ""
        return at(text, line, column, what or "a character that is not allowed in YAML")
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        problem = exc.problem or "not valid YAML"
        context = exc.context
        where, plain = _plain(problem, context)
        mark = exc.context_mark if where == "context" and exc.context_mark is not None else exc.problem_mark
        if plain is None:
            plain = problem
            for token, words in TOKEN_WORDS.items():
                plain = plain.replace(token, words)
            if context and exc.context_mark is not None:
                plain += f" ({context} from line {exc.context_mark.line + 1}, column {exc.context_mark.column + 1})"
        return at(text, mark.line, mark.column, plain)
    # A value YAML could not build (a date like 2026-13-01), with no place in the file.
    return f"is not valid YAML ({exc})" if isinstance(exc, ValueError) else "is not valid YAML"


def _plain(problem: str, context: str | None) -> tuple[str, str | None]:
    for pattern, where, words in PLAIN_WORDS:
        found = pattern.match(problem)
        if found:
            return where, found.expand(words).replace("tag:yaml.org,2002:", "!!")
    return "problem", None


def _place(text: str, position: Any) -> tuple[int, int]:
    """Line and column (both from 0) of a character position."""
    if not isinstance(position, int):
        return 0, 0
    before = text[:position]
    line = before.count("\n")
    return line, position - (before.rfind("\n") + 1)


def at(text: str, line: int, column: int, problem: str) -> str:
    """``line L, column C: problem``, then the line (from 0) and a caret under the column."""
    lines = text.splitlines()
    head = f"line {line + 1}, column {column + 1}: {problem}"
    if not 0 <= line < len(lines):
        return head
    # One column per character, so the caret stays under its place: a tab is a space here, and
    # a control character (which a terminal would show as an escape, wider) a '?'.
    shown = "".join(c if c.isprintable() else " " if c == "\t" else "?" for c in lines[line])
    start = max(0, min(column - EXCERPT_CHARS // 2, len(shown) - EXCERPT_CHARS))
    piece = ("..." if start else "") + shown[start : start + EXCERPT_CHARS]
    caret = column - start + (3 if start else 0)
    number = str(line + 1)
    # Indented: a line that continues the error above it (see DefinitionError).
    return f"{head}\n  {number} | {piece}\n  {' ' * len(number)} | {' ' * caret}^"
