"""Strict YAML, as chordbeat reads every file people write (schedule files, the alert channels'
file): the loader that refuses what makes a file say something other than what it shows, and its
mistakes in a person's words: where, what, and the line itself.

PyYAML's own message names its classes and internal states ("while scanning a simple key",
"<block end>") and points at where it gave up, often the line after the mistake. An operator
gets ``line L, column C: <problem>`` at the mistake, then that line with a caret under it.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.reader import Reader, ReaderError
from yaml.resolver import Resolver

try:
    from yaml._yaml import CParser
except ImportError:  # PyYAML built without libyaml: the pure loader reads every file (read_yaml)
    from yaml.parser import Parser as CParser  # type: ignore[assignment]

from celeryapp.domain.limits import short_repr
from celeryapp.errors import ChordbeatError

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


#: Nesting of the file's YAML collections; a definition needs about 40.
MAX_YAML_DEPTH = 64


class Refused(ChordbeatError):
    """A construct a file may not use, at a place in the file."""

    def __init__(self, mark: Any, reason: str) -> None:
        super().__init__(reason)
        self.mark = mark
        self.reason = reason


_BOOL_TAG = "tag:yaml.org,2002:bool"
_STR_TAG = "tag:yaml.org,2002:str"
#: Booleans of YAML 1.1 only (YAML 1.2 reads them as text).
_YAML11_BOOLS = frozenset({"on", "off", "yes", "no"})


def _is_yaml11_bool(node: yaml.Node) -> bool:
    # A plain scalar's style is None from PyYAML's parser, "" from libyaml's.
    plain = isinstance(node, yaml.ScalarNode) and not node.style
    return plain and node.tag == _BOOL_TAG and str(node.value).lower() in _YAML11_BOOLS


class StrictChecks(Composer, SafeConstructor):
    """``safe_load`` without what makes a file say something other than what it shows: the checks
    of both loaders below, done as nodes are composed and mappings built.

    Refused: anchors and aliases (``*name`` copies a subtree; nested, they expand a small file
    into gigabytes), merge keys (``<<``), duplicate keys (YAML keeps the last one silently) and
    nesting deeper than :data:`MAX_YAML_DEPTH`. A plain ``on:``, ``off:``, ``yes:`` or ``no:`` key
    is that text, not YAML 1.1's boolean.
    """

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()  # type: ignore[attr-defined]
        if isinstance(event, yaml.AliasEvent):
            raise Refused(event.start_mark, f"YAML aliases (*{event.anchor}) are not allowed; write the value out")
        if getattr(event, "anchor", None) is not None:
            raise Refused(event.start_mark, f"YAML anchors (&{event.anchor}) are not allowed")
        self._depth += 1
        if self._depth > MAX_YAML_DEPTH:
            raise Refused(event.start_mark, f"nested more than {MAX_YAML_DEPTH} levels deep")
        try:
            return super().compose_node(parent, index)  # type: ignore[no-any-return,return-value]
        finally:
            self._depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, Any] = {}
        for key_node, _value in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise Refused(key_node.start_mark, "YAML merge keys (<<) are not allowed")
            if _is_yaml11_bool(key_node):
                # YAML 1.1 reads a plain `on:` (yes, no, off) as a boolean; a key is a name (alerts'
                # `on:` is one), and JSON keys are strings: kept as written. (`true:` stays what
                # every YAML reads it as.)
                key_node.tag = _STR_TAG
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark)
            except TypeError:
                continue  # an unhashable key: the constructor refuses it with its own message
            if first is not key_node.start_mark:
                raise Refused(key_node.start_mark, f"duplicate key {short_repr(key)} (first on line {first.line + 1})")
        return super().construct_mapping(node, deep=deep)  # type: ignore[misc,no-any-return]


class StrictLoader(StrictChecks, yaml.SafeLoader):
    """The strict loader in pure Python: PyYAML's scanner and parser, whose mistakes
    :func:`yaml_problem` words."""


class FastStrictLoader(StrictChecks, Composer, CParser, SafeConstructor, Resolver):  # type: ignore[misc]
    """The strict loader on libyaml's scanner and parser (about nine times faster; a file of
    100,000 schedules is 12 MB), the nodes composed and checked by the same Python code as
    :class:`StrictLoader`'s (``Composer`` comes before ``CParser``, which composes in C)."""

    def __init__(self, stream: str) -> None:
        CParser.__init__(self, stream)
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)


class YamlMistake(ChordbeatError, ValueError):
    """A file's YAML that :func:`read_yaml` refuses; its message says where and what."""


def read_yaml(text: str) -> Any:
    """The document ``text`` holds, read by :class:`StrictLoader`: by :class:`FastStrictLoader`
    when libyaml is there and the text has only characters PyYAML reads. A text the fast one
    refuses is read again by the pure one, for its mistake in the words :func:`yaml_problem` has
    (libyaml's differ), or its document should the two disagree on what is YAML."""
    if yaml.__with_libyaml__ and not Reader.NON_PRINTABLE.search(text):
        loader = FastStrictLoader(text)
        try:
            return loader.get_single_data()
        except (Refused, yaml.YAMLError, ValueError):
            pass
        finally:
            loader.dispose()
    try:
        return yaml.load(text, Loader=StrictLoader)
    except Refused as exc:
        raise YamlMistake(at(text, exc.mark.line, exc.mark.column, exc.reason)) from None
    except (yaml.YAMLError, ValueError) as exc:
        raise YamlMistake(yaml_problem(exc, text)) from None
