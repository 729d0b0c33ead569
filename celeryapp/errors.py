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
    """Raised when a schedule definition (or schedule file) is invalid.

    A definition with several mistakes gets one error holding them all (:meth:`every`): ``errors``
    lists each, the message is one ``"<field>: <reason>"`` line per error, and ``field`` and
    ``reason`` are the first one's. The class stays ``DefinitionError`` whatever the count: its
    name is what a caller in another language sees (Celery's ``exc_type``).
    """

    def __init__(self, field: str, reason: str | None = None) -> None:
        super().__init__(field, reason)
        self.errors: list[DefinitionError] = [self]
        #: Errors found beyond those listed (the list is capped).
        self.more = 0
        if reason is None and "\n" in self.reason:
            # Rebuilt from a message of several lines (see FieldError): each error again.
            self._read_lines(str(self))

    @classmethod
    def every(cls, errors: list[DefinitionError], more: int = 0) -> DefinitionError:
        """One error for all of ``errors`` (the first, when it is alone)."""
        if len(errors) == 1 and not more:
            return errors[0]
        lines = [str(e) for e in errors] + ([f"{MORE_PREFIX}{more} more"] if more else [])
        combined = cls("\n".join(lines))
        combined.reason = errors[0].reason
        combined.errors, combined.more = list(errors), more
        return combined

    def _read_lines(self, message: str) -> None:
        found: list[DefinitionError] = []
        for line in message.split("\n"):
            count = line.removeprefix(MORE_PREFIX).removesuffix(" more")
            if line.startswith(MORE_PREFIX) and count.isdigit():
                self.more = int(count)
            elif found and (line[:1].isspace() or ": " not in line):
                # An indented line continues the reason above it (a YAML error's excerpt).
                found[-1] = DefinitionError(found[-1].field, f"{found[-1].reason}\n{line}")
            else:
                found.append(DefinitionError(line))
        self.errors = found
        self.reason = found[0].reason


#: The last line of an error listing fewer errors than it found.
MORE_PREFIX = "... and "


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
