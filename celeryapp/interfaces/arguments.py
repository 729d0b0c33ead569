"""Checks of the service tasks' arguments: each returns the value to use or raises
:class:`InvalidArgument` naming the argument, before anything is read or written."""

from __future__ import annotations

import socket
import unicodedata
from enum import StrEnum
from typing import Any, TypeVar

from celeryapp.domain.limits import (
    MAX_ID,
    MAX_LIST_LIMIT,
    MAX_NAME_CHARS,
    check_json,
    is_unicode,
    short_repr,
    type_name,
)
from celeryapp.errors import InvalidArgument
from celeryapp.states import AuditSource
from models import ExecutionStatus
from models.audit import ACTOR_CHARS, REASON_CHARS, Actor

StateT = TypeVar("StateT", bound=StrEnum)

#: Unicode categories refused in an actor or a reason: control, format (bidirectional overrides
#: make a log line read otherwise than it is), surrogate, private-use and unassigned characters.
_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn"})


def name_arg(value: Any, field: str = "name") -> str:
    """A schedule to look up. Not held to the name pattern, so a schedule stored before a rule
    tightened can still be found, paused and deleted."""
    if not isinstance(value, str):
        raise InvalidArgument(field, f"must be a schedule name (a string), got {type_name(value)}")
    if not 1 <= len(value) <= MAX_NAME_CHARS:
        raise InvalidArgument(field, f"must be 1 to {MAX_NAME_CHARS} characters, got {len(value)}")
    # No stored name holds these, and the database drivers refuse them with a traceback.
    if "\x00" in value or not is_unicode(value):
        raise InvalidArgument(field, "must not hold NUL characters or lone surrogates")
    return value


def execution_id_arg(value: Any, field: str = "execution_id", what: str = "an execution id") -> int:
    """A row's id (``what`` names the row in the refusal: an execution id, a backfill id)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(field, f"must be an integer ({what}), got {type_name(value)}")
    if not 1 <= value <= MAX_ID:
        raise InvalidArgument(field, f"must be between 1 and {MAX_ID}, got {short_repr(value)}")
    return value


def version_arg(value: Any, field: str = "version") -> int:
    """A schedule's definition version: numbered from 1."""
    return execution_id_arg(value, field, "a definition version")


def limit_arg(value: Any, high: int = MAX_LIST_LIMIT) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        got = short_repr(value) if isinstance(value, int) and not isinstance(value, bool) else type_name(value)
        raise InvalidArgument("limit", f"must be an integer between 1 and {high}, got {got}")
    return value


def choice_arg(value: Any, choices: type[StateT], field: str) -> StateT | None:
    """One of ``choices``' stored names, spelled exactly (a look-alike letter is none of them)."""
    if value is None:
        return None
    names = ", ".join(c.value for c in choices)
    if not isinstance(value, str):
        raise InvalidArgument(field, f"must be one of {names}, got {type_name(value)}")
    try:
        return choices(value)
    except ValueError:
        raise InvalidArgument(field, f"must be one of {names}, got {short_repr(value)}") from None


def status_arg(value: Any) -> ExecutionStatus | None:
    return choice_arg(value, ExecutionStatus, "status")


def payload_arg(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidArgument("payload", f"must be an object, got {type_name(value)}")
    check_json(value, "payload", InvalidArgument)
    return value


def flag_arg(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(field, f"must be true or false, got {type_name(value)}")
    return value


def text_arg(value: Any, field: str, high: int) -> str:
    """One line of printable text, 1 to ``high`` characters, shown to people as it is."""
    if not isinstance(value, str):
        raise InvalidArgument(field, f"must be a string, got {type_name(value)}")
    if not 1 <= len(value) <= high:
        raise InvalidArgument(field, f"must be 1 to {high} characters, got {len(value)}")
    if not value.strip():
        raise InvalidArgument(field, "must not be blank")
    if any(unicodedata.category(c) in _REFUSED_CATEGORIES for c in value):
        raise InvalidArgument(field, "must not hold control, format or unassigned characters (one line of text)")
    return value


def reason_arg(value: Any) -> str | None:
    """Why, in the operator's words; an empty reason (a form left blank) is no reason."""
    if value is None or value == "":
        return None
    return text_arg(value, "reason", REASON_CHARS)


def source_arg(value: Any) -> AuditSource:
    if not isinstance(value, AuditSource):
        raise InvalidArgument("source", f"must be an AuditSource, got {type_name(value)}")
    return value


def actor_arg(value: Any, source: AuditSource) -> Actor:
    """Who acts. Not given: the source and this host (an in-process caller that named nobody)."""
    source = source_arg(source)
    if value is None:
        return default_actor(source, socket.gethostname())
    return Actor(text_arg(value, "actor", ACTOR_CHARS), source)


def default_actor(source: AuditSource, origin: str | None) -> Actor:
    """``<source>@<origin>``, the origin cut and cleaned: it comes from a message header or a host
    name, not from a checked argument, and must still be a readable, storable actor."""
    cleaned = "".join(c for c in origin or "" if unicodedata.category(c) not in _REFUSED_CATEGORIES and is_unicode(c))
    name = f"{source.value}@{cleaned.strip()}" if cleaned.strip() else source.value
    return Actor(name[:ACTOR_CHARS], source)
