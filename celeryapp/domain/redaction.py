"""What secrets look like when shown: URLs without passwords, payload and ``env`` values hidden.

Task results travel to their caller in full; only their *representation* (worker logs, the
``task-succeeded`` event Flower shows) is redacted. Executable steps' ``env`` values never leave
in a schedule object at all.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

#: What replaces a hidden value.
HIDDEN = "<hidden>"


def redact(value: Any) -> Any:
    """A copy with every ``payload`` and ``env`` value replaced, for display only."""
    if isinstance(value, dict):
        return {k: HIDDEN if k in {"payload", "env"} and v else redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


class RedactedResult:
    """A task's return value whose repr hides payloads and ``env`` values.

    Celery logs ``saferepr(result)`` and puts it in the ``task-succeeded`` event; the result backend
    serializes it with kombu's JSON encoder, which calls ``__json__``, so the caller gets it whole.
    """

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __json__(self) -> Any:
        return self.value

    def __repr__(self) -> str:
        return repr(redact(self.value))


def hide_env_values(steps: list[Any]) -> list[Any]:
    """Step groups (as a schedule object shows them) with every ``env`` value replaced."""

    def hide(step: Any) -> Any:
        if isinstance(step, list):
            return [hide(s) for s in step]
        if isinstance(step, Mapping) and isinstance(step.get("env"), Mapping):
            return {**step, "env": dict.fromkeys(step["env"], HIDDEN)}
        return step

    return [hide(group) for group in steps]


def credentials_apart(url: str) -> tuple[str, dict[str, str]]:
    """A Redis URL without its user name and password, and those as redis-py connection options.

    Celery masks settings by name (``*password*``) but shows ``redbeat_redis_url`` as it is; kept
    apart, the password sits in ``redbeat_redis_options`` where ``celery inspect conf`` masks it.
    """
    parts = urlsplit(url)
    userinfo, at, host = parts.netloc.rpartition("@")
    query = parse_qsl(parts.query, keep_blank_values=True)
    options: dict[str, str] = {}
    if at:
        user, _colon, password = userinfo.partition(":")
        if user:
            options["username"] = unquote(user)
        if password:
            options["password"] = unquote(password)
    for key, value in query:
        if key in {"username", "password"} and value:
            options[key] = value
    if not options:
        return url, {}
    kept = urlencode([(k, v) for k, v in query if k not in {"username", "password"}])
    # Spelled out: urlunsplit drops the "//" of an empty host (unix:///path), which redis-py refuses.
    return f"{parts.scheme}://{host}{parts.path}" + (f"?{kept}" if kept else ""), options


#: ``scheme://user:password@``: the password of a URL in free text (a driver's error, a log line).
_URL_PASSWORD = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s/:@]*:)[^\s/@]+@")
#: ``password=...`` and the like in free text (connection strings, keyword arguments in a repr).
#: ``token`` and ``secret`` only with ``=``: "unexpected token: '}'" is a parser's message.
_KEYWORD_SECRET = re.compile(
    r"(\b(?:(?:password|passwd|pwd)\s*[=:]|(?:secret|token|api_?key)\s*=)\s*['\"]?)[^\s'\",;)]+", re.IGNORECASE
)


def hide_secrets(text: str) -> str:
    """``text`` (a traceback, log lines) with URL passwords and ``password=`` values replaced.

    Step code writes what it likes into its exceptions and logs; what is kept of them is shown on
    the dashboard, in the CLI and in Flower, to people who may not see the step's credentials.
    """
    return _KEYWORD_SECRET.sub(rf"\g<1>{HIDDEN}", _URL_PASSWORD.sub(rf"\g<1>{HIDDEN}@", text))


def url_secrets(url: str) -> set[str]:
    """The parts of a URL read from a channel's variable that are its secrets, as written and
    decoded: the whole URL, its user and password, its path and query (a Slack webhook's path is
    its token); an unparseable URL, all of it and what follows its scheme."""
    found = {url}
    _scheme, _sep, rest = url.partition("://")
    found.add(rest)
    try:
        parts = urlsplit(url)
        pieces = [parts.username or "", parts.password or "", parts.query, parts.fragment]
        if parts.path.strip("/"):
            pieces += [parts.path, parts.path + ("?" + parts.query if parts.query else "")]
    except ValueError:
        pieces = []
    # What http.client quotes back of an unparseable URL: what follows its user (a "port" that
    # is "password@host"), and the netloc after the scheme.
    userinfo, at, _host = rest.partition("/")[0].rpartition("@")
    if at:
        pieces += [userinfo, *userinfo.split(":", 1)]
    for piece in pieces:
        found.update({piece, unquote(piece)})
    return {piece for piece in found if piece}


def hide_values(text: str, values: set[str] | frozenset[str], shortest: int = 4) -> str:
    """``text`` with every one of ``values`` (secrets known by value) replaced, longest first so
    that a part of one never leaves the rest of it showing; values shorter than ``shortest``
    characters are not looked for (every "a" would go), :func:`hide_secrets` is applied too."""
    for value in sorted((v for v in values if len(v) >= shortest), key=len, reverse=True):
        text = text.replace(value, HIDDEN)
    return hide_secrets(text)
