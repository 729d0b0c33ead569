"""Exceptions raised by chordbeat; every one derives from :class:`ChordbeatError`."""

from __future__ import annotations


class ChordbeatError(Exception):
    """Base class of every error chordbeat raises on purpose."""


class ConfigError(ChordbeatError):
    """Raised when a ``CHORDBEAT_*`` variable holds a value that cannot be used."""


class DefinitionError(ChordbeatError, ValueError):
    """Raised when a schedule definition is invalid; the message names the field and the reason."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class NotFound(ChordbeatError, LookupError):
    """Raised when a schedule or execution named by a caller does not exist."""


class InvalidTransition(ChordbeatError):
    """Raised when a caller asks for a state change the current state does not allow."""


class StepCancelled(BaseException):
    """Raised inside a running step when its execution was cancelled.

    A ``BaseException`` so that step code catching ``Exception`` does not swallow it.
    """
