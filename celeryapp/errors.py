"""Exceptions raised by chordbeat; every one derives from :class:`ChordbeatError`.

For callers in other languages the class name (Celery's ``exc_type``) and the message are the
contract: README.md, "Errors callers see", lists them. What is not a ``ChordbeatError`` is a fault,
not an answer: a broken database or broker (the caller may retry), or a bug (a ``ValueError`` for a
naive datetime given to a UTC column, say), never a refusal of the caller's input.
"""

from __future__ import annotations


class ChordbeatError(Exception):
    """Base class of every error chordbeat raises on purpose."""


class ConfigError(ChordbeatError):
    """Raised when a ``CHORDBEAT_*`` variable holds a value that cannot be used."""


class FieldError(ChordbeatError, ValueError):
    """Base of the errors about one input field; the message is ``"<field>: <reason>"``."""

    def __init__(self, field: str, reason: str | None = None) -> None:
        if reason is None:
            # Rebuilt from the message alone: a Celery result backend keeps only ``args``, and a
            # client that has this class calls it with them.
            field, _, reason = field.partition(": ")
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class DefinitionError(FieldError):
    """Raised when a schedule definition (or schedule file) is invalid."""


class DefinitionErrors(DefinitionError):
    """Every invalid schedule of a file at once, one ``"<field>: <reason>"`` line each.

    ``field`` and ``reason`` are the first error's, for callers that expect one.
    """

    def __init__(self, errors: list[DefinitionError], more: int = 0) -> None:
        super().__init__(errors[0].field, errors[0].reason)
        self.errors = errors
        self.more = more

    def __str__(self) -> str:
        lines = [str(e) for e in self.errors]
        if self.more:
            lines.append(f"... and {self.more} more")
        return "\n".join(lines)


class InvalidArgument(FieldError):
    """Raised when a service task is called with an argument of the wrong type, size or range."""


class NotFound(ChordbeatError, LookupError):
    """Raised when a schedule or execution named by a caller does not exist."""


class InvalidTransition(ChordbeatError):
    """Raised when a caller asks for a state change the current state does not allow."""


class StepError(ChordbeatError):
    """Raised when an executable or SQL step fails; the message is the activity's error."""


class StepCancelled(BaseException):
    """Raised inside a running step when its execution was cancelled.

    A ``BaseException`` so that step code catching ``Exception`` does not swallow it.
    """
