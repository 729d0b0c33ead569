"""Every mistake of a definition found in one pass: each field's check runs, its error is kept.

A person fixing a schedule should see all its mistakes at once, not one per try. A check whose
input already failed is not run (fire times need a valid zone and cadence): it would only repeat
the first error in other words.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ParamSpec, TypeVar

from celeryapp.errors import DefinitionError

#: Errors of one definition, or of one schedule file, listed at once; past that, how many more.
MAX_REPORTED_ERRORS = 20

_P = ParamSpec("_P")
_T = TypeVar("_T")


class Problems:
    """The errors found so far; :meth:`check` runs one check and keeps what it raises."""

    def __init__(self, prefix: str = "") -> None:
        #: Put before each field path (``schedules[2] (hr).``).
        self.prefix = prefix
        self.errors: list[DefinitionError] = []
        self.more = 0

    def check(self, check: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T | None:
        """``check``'s answer, or ``None`` when it raised (its errors are kept)."""
        try:
            return check(*args, **kwargs)
        except DefinitionError as exc:
            self.add(exc)
            return None

    def add(self, error: DefinitionError) -> None:
        for one in error.errors:
            self.errors.append(DefinitionError(f"{self.prefix}{one.field}", one.reason) if self.prefix else one)
        self.more += error.more

    def failed(self, *fields: str) -> bool:
        """Whether a check of one of ``fields`` (or of something inside one) failed."""
        paths = [f"{self.prefix}{field}" for field in fields]
        return any(e.field == p or e.field.startswith((f"{p}.", f"{p}[")) for e in self.errors for p in paths)

    def raise_any(self) -> None:
        """Raise one error naming every problem found, if there is any."""
        if self.errors:
            shown = self.errors[:MAX_REPORTED_ERRORS]
            raise DefinitionError.every(shown, self.more + len(self.errors) - len(shown))

    def __bool__(self) -> bool:
        return bool(self.errors)
