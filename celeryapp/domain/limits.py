"""Bounds and size caps of everything a caller can send, and the checks of plain JSON values.

Anyone who can publish to the broker can call the service tasks, so every number has a range and
every size a cap; they are documented in docs/schedules.md and docs/security.md ("Input limits").
"""

from __future__ import annotations

import json
import math
from typing import Any

from celeryapp.errors import FieldError

DAY_S = 24 * 3600

#: Interval schedules: at least a second apart (a smaller ``every`` is a busy loop, and one below
#: a microsecond is a zero ``timedelta``), at most a leap year.
MIN_EVERY_S = 1.0
MAX_EVERY_S = 366.0 * DAY_S
#: Execution and step timeouts.
MIN_TIMEOUT_S = 0.1
MAX_TIMEOUT_S = 7.0 * DAY_S
#: Retry backoff base of cron schedules (the largest retry delay is ten times the base).
MIN_RETRY_DELAY_S = 1.0
MAX_RETRY_DELAY_S = 7.0 * DAY_S
MAX_RETRIES = 1000
#: Fits PostgreSQL's 32-bit ``integer`` with room to spare.
MAX_TOTAL_REPEATS = 10**9
MAX_ATTEMPTS = 100

#: Schedule names, step names, task names and queues (the database columns are this long).
MAX_NAME_CHARS = 200
#: A cron expression (the column is this long; 60 comma-separated minutes fit in 170).
MAX_CRON_CHARS = 200
#: Step groups of a schedule, steps of one parallel group, and steps in all: starting a run
#: writes one row per step in one transaction, so this bounds how long a trigger holds the lock.
MAX_GROUPS = 100
MAX_GROUP_STEPS = 100
MAX_STEPS = 500
#: Each of a definition's ``payload``, a step's ``args`` and ``kwargs``, and a trigger's ``payload``,
#: serialized: every execution stores the plan and payload, and every step message carries its args.
MAX_JSON_BYTES = 64 * 1024
#: A whole definition, serialized.
MAX_DEFINITION_BYTES = 256 * 1024
#: Nesting of a JSON value (objects and lists inside each other).
MAX_JSON_DEPTH = 32

#: Largest execution id (PostgreSQL ``integer``).
MAX_ID = 2**31 - 1
#: Most slot records one list call returns.
MAX_LIST_LIMIT = 1000
#: Most execution summaries one ``list_executions`` call returns, and most schedules one
#: ``list_schedules`` call returns (a longer list is read page by page, with the cursor).
MAX_EXECUTION_LIST_LIMIT = 500
MAX_SCHEDULE_LIST_LIMIT = 5000
#: An execution's ``error`` in a list is cut to this many characters (``get_execution`` has it all).
LIST_TEXT_CHARS = 1000

#: The schedule file, in bytes.
MAX_FILE_BYTES = 4 * 1024 * 1024

#: Characters of an error message kept on the activity.
ERROR_CHARS = 2000
#: Characters of a failed attempt's traceback kept on its activity (the end: the raising frames).
TRACEBACK_CHARS = 16 * 1024
#: An attempt's last log lines kept on its activity: at most this many lines and characters.
LOG_TAIL_LINES = 50
LOG_TAIL_CHARS = 8 * 1024

#: Most slots one fire message carries (beat sends more as several): one transaction's worth,
#: and a bound on the statement parameters (SQLite allows 32,766).
MAX_FIRE_BATCH = 100


def json_size(value: Any) -> int:
    """Bytes of ``value`` as compact JSON, counting what is not JSON as a short string.

    For size caps only, checked before a value is looked at closely: C speed on any input.
    Raises ``RecursionError`` for absurd nesting (and ``ValueError`` for a circular one).
    """
    return len(json.dumps(value, skipkeys=True, default=repr, separators=(",", ":")))


def short_repr(value: Any, limit: int = 40) -> str:
    """``repr`` of a caller's value for an error message, cut so a message stays short."""
    try:
        text = repr(value)
    except ValueError:  # an int too long to print
        return "<a huge number>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def seconds_text(value: float) -> str:
    """``604800 seconds (7 days)``: bounds as people read them."""
    number = str(int(value)) if float(value).is_integer() else str(value)
    days = value / DAY_S
    return f"{number} seconds" + (f" ({days:g} days)" if days >= 1 else "")


def type_name(value: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), type(value).__name__
    )


def check_json(value: Any, path: str, error: type[FieldError], *, max_bytes: int = MAX_JSON_BYTES) -> None:
    """Refuse ``value`` unless it is plain JSON that reads back as itself, at most ``max_bytes``.

    Plain: objects with string keys, lists, strings of valid Unicode, finite numbers, 64-bit
    integers, booleans, null; at most :data:`MAX_JSON_DEPTH` levels deep. Anything else would be
    changed by storing it (a tuple becomes a list, an int key a string) or fail later, in the
    database or in a worker.
    """
    walk = _Walk(path, budget=max_bytes // 2 + 2)
    problem = walk.problem(value, path, 0)
    if walk.budget < 0:
        raise error(path, f"is more than {max_bytes} bytes of JSON")
    if problem is not None:
        raise error(*problem)
    size = json_size(value)
    if size > max_bytes:
        raise error(path, f"is {size} bytes of JSON, more than {max_bytes}")


class _Walk:
    """Finds the first problem of a value, visiting at most ``budget`` values: a JSON text holds
    fewer than one value per two bytes, so running out means the value is too big anyway."""

    def __init__(self, root: str, budget: int) -> None:
        self.root = root
        self.budget = budget

    def problem(self, value: Any, path: str, depth: int) -> tuple[str, str] | None:
        self.budget -= 1
        if self.budget < 0:
            return None
        if value is None or isinstance(value, bool | int | float | str):
            return _scalar_problem(value, path)
        if depth >= MAX_JSON_DEPTH:
            return self.root, f"must be JSON nested at most {MAX_JSON_DEPTH} levels deep"
        if isinstance(value, list):
            for index, item in enumerate(value):
                problem = self.problem(item, f"{path}[{index}]", depth + 1)
                if problem is not None or self.budget < 0:
                    return problem
            return None
        if isinstance(value, dict):
            for key, item in value.items():
                self.budget -= 1
                if self.budget < 0:
                    return None
                if not isinstance(key, str) or not is_unicode(key):
                    return path, f"must have string keys, got {short_repr(key)}"
                problem = self.problem(item, _key_path(path, key), depth + 1)
                if problem is not None or self.budget < 0:
                    return problem
            return None
        return path, f"must be plain JSON, got {type_name(value)}"


def _scalar_problem(value: bool | int | float | str | None, path: str) -> tuple[str, str] | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return None if -(2**63) <= value < 2**63 else (path, "must be an integer of at most 64 bits")
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, f"must be a finite number, got {value}")
    return None if is_unicode(value) else (path, "must be valid Unicode text (it holds a lone surrogate)")


def is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _key_path(path: str, key: str) -> str:
    plain = 0 < len(key) <= 40 and key.isascii() and key.replace("_", "a").replace("-", "a").isalnum()
    return f"{path}.{key}" if plain else f"{path}[{short_repr(key)}]"


def check_int(value: Any, field: str, error: type[FieldError], *, low: int = 1, high: int = MAX_ID) -> int:
    """An integer argument within [low, high]; booleans are not integers."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(field, f"must be an integer, got {type_name(value)}")
    if not low <= value <= high:
        raise error(field, f"must be between {low} and {high}, got {short_repr(value)}")
    return value
