"""A definition's ``deadlines`` and ``alerts`` read from untrusted JSON, every problem at once.

Channels are names only. What a channel is (a webhook's URL and key, a mail account) belongs to
the deployment: the ``CHORDBEAT_ALERT_CHANNELS`` file, with its secrets in environment variables.
A URL, an address or a token written where a name belongs is refused, and never repeated in the
error: errors are logged, audited and shown to whoever applied the definition.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from typing import Any

from celeryapp.domain import limits
from celeryapp.domain.definition import ALERT_ON_KINDS, AlertRules, Deadlines
from celeryapp.domain.fields import distinct_names, refuse_unknown, require_mapping, seconds_field
from celeryapp.domain.limits import short_repr, type_name
from celeryapp.domain.problems import Problems
from celeryapp.errors import ConfigError, DefinitionError
from celeryapp.states import AlertKind

#: A channel's name, as the channels file defines them (celeryapp/alerting/channels.py).
CHANNEL_PATTERN = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
#: Channels one definition may name (the file may define 100).
MAX_CHANNELS = 20
#: Bounds of ``start_within`` and ``finish_within``. The longest is the longest a run may be
#: given (a step's timeout): the deadline watch looks back no further for slots still owed a run.
MIN_DEADLINE_S = 1.0
MAX_DEADLINE_S = limits.MAX_TIMEOUT_S
#: ``finish_by``: ``HH:MM`` from 00:00 to 23:59, two ASCII digits each (``\d`` would take other
#: scripts' digits, which ``int()`` then reads).
FINISH_BY_PATTERN = re.compile(r"(?:[01][0-9]|2[0-3]):[0-5][0-9]")
DEADLINE_FIELDS = frozenset({"start_within", "finish_within", "finish_by"})
ALERT_FIELDS = frozenset({"channels", "on"})
#: What the refusal of anything but a channel's name says.
CHANNELS_HINT = "only channel names: define channels in the CHORDBEAT_ALERT_CHANNELS file"
#: Fields people write in ``alerts`` when they mean a channel: they get the hint.
_CHANNEL_LIKE_FIELDS = frozenset(
    {"url", "urls", "webhook", "webhooks", "slack", "email", "emails", "to", "secret", "smtp_url", "address"}
)
_URL_STARTS = ("http:", "https:", "mailto:", "smtp:", "smtps:", "www.")
#: Names listed in an "is not defined" error; past that, how many more.
_SHOWN_NAMES = 10

#: The channel names of the ``CHORDBEAT_ALERT_CHANNELS`` file, asked only when a definition names
#: a channel (so a broken file refuses only definitions that need it); ``None`` when the variable
#: is not set. May raise :class:`ConfigError` for a file that cannot be used.
KnownChannels = Callable[[], frozenset[str] | None]


def parse_deadlines(raw: Mapping[str, Any]) -> Deadlines | None:
    """The definition's ``deadlines`` (``None`` when absent or null)."""
    value = raw.get("deadlines")
    if value is None:
        return None
    deadlines = require_mapping(value, "deadlines")
    problems = Problems()
    problems.check(refuse_unknown, deadlines, DEADLINE_FIELDS, "deadlines")
    start, finish = (
        problems.check(seconds_field, deadlines, key, f"deadlines.{key}", None, low=MIN_DEADLINE_S, high=MAX_DEADLINE_S)
        for key in ("start_within", "finish_within")
    )
    finish_by = problems.check(_finish_by, deadlines.get("finish_by"))
    if not problems and start is None and finish is None and finish_by is None:
        problems.add(DefinitionError("deadlines", "must give at least one of start_within, finish_within, finish_by"))
    if start is not None and finish is not None and start > finish:
        problems.add(
            DefinitionError(
                "deadlines.start_within",
                f"must not be later than finish_within ({limits.seconds_text(start)} > {limits.seconds_text(finish)})",
            )
        )
    problems.raise_any()
    return Deadlines(start_within_s=start, finish_within_s=finish, finish_by=finish_by)


def _finish_by(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        hint = ""
        if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 24 * 60:
            # YAML 1.1 reads an unquoted 22:30 as sexagesimal 22*60+30: say what was meant.
            hours, minutes = divmod(value, 60)
            meant = f"{hours}:{minutes:02}"
            hint = f'; in YAML quote it, finish_by: "{meant:0>5}" (unquoted, {meant} is read as {value})'
        raise DefinitionError("deadlines.finish_by", f"must be a time written HH:MM, got {type_name(value)}{hint}")
    if not FINISH_BY_PATTERN.fullmatch(value):
        raise DefinitionError(
            "deadlines.finish_by", f"must be a time written HH:MM from 00:00 to 23:59, got {short_repr(value)}"
        )
    return value


def parse_alerts(raw: Mapping[str, Any]) -> AlertRules | None:
    """The definition's ``alerts`` (``None`` when absent or null). ``on`` left out asks for every
    kind a definition may name."""
    value = raw.get("alerts")
    if value is None:
        return None
    alerts = require_mapping(value, "alerts")
    problems = Problems()
    channel_like = sorted(key for key in alerts if key in _CHANNEL_LIKE_FIELDS)
    for key in channel_like:
        problems.add(DefinitionError(f"alerts.{key}", f"unknown field; {CHANNELS_HINT}"))
    others = {key: item for key, item in alerts.items() if key not in _CHANNEL_LIKE_FIELDS}
    problems.check(refuse_unknown, others, ALERT_FIELDS, "alerts")
    channels = problems.check(_channels, alerts.get("channels"), on_given=alerts.get("on") is not None)
    on = problems.check(_on, alerts.get("on"))
    problems.raise_any()
    assert channels is not None and on is not None
    return AlertRules(channels=channels, on=on)


def _channels(value: Any, *, on_given: bool) -> tuple[str, ...]:
    path = "alerts.channels"
    if value is None:
        why = (
            "alerts.on asks for alerts but nothing says where to send them"
            if on_given
            else "alerts need somewhere to go"
        )
        raise DefinitionError(
            path, f"is required ({why}): a list of channel names of the CHORDBEAT_ALERT_CHANNELS file"
        )
    if not isinstance(value, list):
        hint = f"; {CHANNELS_HINT}" if isinstance(value, str) and _entry_problem(value) else ""
        raise DefinitionError(path, f"must be a list of channel names, got {type_name(value)}{hint}")
    if not value:
        raise DefinitionError(path, "must name at least one channel")
    if len(value) > MAX_CHANNELS:
        raise DefinitionError(path, f"must name at most {MAX_CHANNELS} channels, got {len(value)}")
    return distinct_names(value, path, _entry_problem)


def _entry_problem(entry: Any) -> str | None:
    """Why ``entry`` is not a channel's name, without repeating it (it may be a secret)."""
    if not isinstance(entry, str):
        return f"must be a channel name, got {type_name(entry)}"
    if CHANNEL_PATTERN.fullmatch(entry):
        return None
    lowered = entry.lower()
    if "://" in lowered or lowered.startswith(_URL_STARTS):
        return f"is a URL (not shown), not a channel name; {CHANNELS_HINT}"
    if "@" in entry:
        return f"is an email address (not shown), not a channel name; {CHANNELS_HINT}"
    if CHANNEL_PATTERN.fullmatch(lowered):
        return "is not a channel name (not shown): channel names are lower case"
    return (
        "is not a channel name (not shown: it may be a secret): 1 to 32 of a-z, 0-9, '_' and '-', "
        f"starting with a letter or digit; {CHANNELS_HINT}"
    )


def _on(value: Any) -> tuple[AlertKind, ...]:
    path = "alerts.on"
    choices = ", ".join(kind.value for kind in ALERT_ON_KINDS)
    if value is None:
        return ALERT_ON_KINDS
    if not isinstance(value, list):
        raise DefinitionError(path, f"must be a list of alert kinds ({choices}), got {type_name(value)}")
    if not value:
        raise DefinitionError(path, f"must name at least one of {choices} (leave alerts out for none)")
    if len(value) > len(ALERT_ON_KINDS):
        raise DefinitionError(path, f"must name each of {choices} at most once, got {len(value)} values")
    problems = Problems()
    seen: dict[AlertKind, int] = {}
    for index, entry in enumerate(value):
        kind = next((k for k in ALERT_ON_KINDS if k.value == entry), None) if isinstance(entry, str) else None
        if kind is None:
            problems.add(DefinitionError(f"{path}[{index}]", _unknown_kind(entry, choices)))
        elif kind in seen:
            problems.add(
                DefinitionError(f"{path}[{index}]", f"{kind.value!r} is named twice (also {path}[{seen[kind]}])")
            )
        else:
            seen[kind] = index
    problems.raise_any()
    return tuple(seen)


def _unknown_kind(entry: Any, choices: str) -> str:
    if entry == AlertKind.RESOLVED.value:
        return "'resolved' is not asked for: it follows 'late' (sent when a late run ends); name 'late'"
    if entry == AlertKind.TEST.value:
        return "'test' is not asked for: an operator sends it with 'chordbeat alerts test CHANNEL'"
    shown = short_repr(entry) if isinstance(entry, str) else type_name(entry)
    return f"must be one of {choices}, got {shown}"


def check_late_has_deadlines(raw: Mapping[str, Any], alerts: AlertRules | None, deadlines: Deadlines | None) -> None:
    """``on: [late]`` written with no deadlines would never alert: said, not silently stored.
    (``on`` left out asks for every kind, ``late`` among them, and is no mistake.)"""
    written = isinstance(raw.get("alerts"), Mapping) and raw["alerts"].get("on") is not None
    if alerts is None or deadlines is not None or not written or AlertKind.LATE not in alerts.on:
        return
    index = alerts.on.index(AlertKind.LATE)
    raise DefinitionError(
        f"alerts.on[{index}]",
        "'late' needs deadlines (start_within, finish_within or finish_by): without them no run is late",
    )


def check_known_channels(alerts: AlertRules | None, known: KnownChannels) -> None:
    """Every channel ``alerts`` names is one of the ``CHORDBEAT_ALERT_CHANNELS`` file's."""
    if alerts is None:
        return
    path = "alerts.channels"
    try:
        names = known()
    except ConfigError as exc:
        raise DefinitionError(path, f"the CHORDBEAT_ALERT_CHANNELS file cannot be used: {exc}") from None
    if names is None:
        raise DefinitionError(
            path,
            "names channels, but CHORDBEAT_ALERT_CHANNELS is not set: this deployment has no channels file, "
            "so no alert could be sent (see docs/alerts.md)",
        )
    listed = sorted(names)
    defined = ", ".join(listed[:_SHOWN_NAMES]) + (
        f" and {len(listed) - _SHOWN_NAMES} more" if len(listed) > _SHOWN_NAMES else ""
    )
    where = f"it defines {defined}" if listed else "it defines no channel"
    unknown = [
        DefinitionError(f"{path}[{index}]", f"{name!r} is not defined in the CHORDBEAT_ALERT_CHANNELS file ({where})")
        for index, name in enumerate(alerts.channels)
        if name not in names
    ]
    if unknown:
        raise DefinitionError.every(unknown)


def read_once(known: KnownChannels) -> KnownChannels:
    """``known``, asked at most once while it answers: a schedule file's definitions share one
    reading of the channels file."""
    return functools.cache(known)
