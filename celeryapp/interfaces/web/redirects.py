"""Where the dashboard may send a browser back to: a ``next`` of this site only.

The check reads the target as a browser reads a ``Location`` or an ``href`` (the WHATWG URL
parser), not as written: a browser strips leading and trailing C0 controls and spaces, drops every
tab and newline and, for http and https, takes a backslash for a slash. So ``/\\t/evil.example``,
``/\\evil.example`` or ``\\/evil.example`` are all ``//evil.example`` to it: another site. Every
page that takes a ``next`` (the login, the actions, the confirmation page's Back link) uses this
one function, and hands on the target as the browser would read it."""

from __future__ import annotations

#: What the URL parser strips from both ends of the input: C0 controls and space.
C0_CONTROL_OR_SPACE = "".join(chr(code) for code in range(0x21))
#: What the URL parser removes wherever it is.
_TAB_OR_NEWLINE = str.maketrans("", "", "\t\n\r")


def browser_reading(target: str) -> str:
    """``target`` as a browser's URL parser reads it against an http(s) page, before resolving."""
    return target.strip(C0_CONTROL_OR_SPACE).translate(_TAB_OR_NEWLINE).replace("\\", "/")


def same_site_path(target: str, fallback: str = "/") -> str:
    """``target`` as the browser will read it when that is a path of this site (``/`` then not a
    second ``/``: no scheme, no host); else ``fallback``. A control character left inside is
    refused too: it has no business in a path and cannot go in a ``Location`` header."""
    path = browser_reading(target)
    if not path.startswith("/") or path.startswith("//"):
        return fallback
    if any(ord(character) < 0x20 or ord(character) == 0x7F for character in path):
        return fallback
    return path
