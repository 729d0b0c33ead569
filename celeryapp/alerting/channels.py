"""The alert channels file (``CHORDBEAT_ALERT_CHANNELS``): where alerts may be sent.

The file is the deployment's, not a definition's: definitions name channels, the file says what a
channel is. Secrets (a webhook's URL, its signing key, the SMTP account) live in environment
variables the file names, never in the file: a URL or key written where a variable's name belongs
is refused, so the file can be kept in a repository and shown in a review.

```yaml
channels:
  ops-webhook: {kind: webhook, url_env: OPS_WEBHOOK_URL, secret_env: OPS_WEBHOOK_SECRET}
  ops-slack:   {kind: slack, url_env: OPS_SLACK_URL}
  ops-mail:    {kind: email, to: ["ops@example.com"], smtp_url_env: CHORDBEAT_SMTP_URL}
```
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

from celeryapp.config import Settings
from celeryapp.domain.limits import MAX_FILE_BYTES, short_repr
from celeryapp.domain.strict_yaml import YamlMistake, read_yaml
from celeryapp.errors import ConfigError

ChannelKind = Literal["webhook", "slack", "email"]

#: A channel's name: what definitions write in ``alerts.channels`` (the column holds 32 characters).
NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
#: An environment variable's name as deployments write them (upper case): a lower-case or mixed
#: value is far more likely a secret pasted in than a variable's name.
VARIABLE_PATTERN = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
#: An address of ``to`` and ``sender``: one plain ``local@domain``, nothing that could end a
#: header line or add a recipient (spaces, commas, angle brackets, quotes, control characters).
ADDRESS_PATTERN = re.compile(r"^[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]{1,64}@[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$")
#: Channels one file may define and recipients one email channel may have.
MAX_CHANNELS = 100
MAX_RECIPIENTS = 50
#: The From of email channels that name none.
DEFAULT_SENDER = "chordbeat@localhost"
#: The variable an email channel's SMTP URL comes from when it names none (the contract's).
DEFAULT_SMTP_URL_ENV = "CHORDBEAT_SMTP_URL"
#: Fields each kind takes, and those it must have.
_FIELDS: dict[str, frozenset[str]] = {
    "webhook": frozenset({"kind", "url_env", "secret_env", "insecure"}),
    "slack": frozenset({"kind", "url_env", "insecure"}),
    "email": frozenset({"kind", "to", "smtp_url_env", "sender"}),
}
_REQUIRED: dict[str, frozenset[str]] = {
    "webhook": frozenset({"url_env"}),
    "slack": frozenset({"url_env"}),
    "email": frozenset({"to"}),
}
#: Fields people write when they mean a variable's name; the error says which field to use.
_SECRET_FIELDS = {"url": "url_env", "secret": "secret_env", "smtp_url": "smtp_url_env", "password": "smtp_url_env"}


@dataclass(frozen=True)
class Channel:
    """One channel of the file; the ``*_env`` fields are names of environment variables."""

    name: str
    kind: ChannelKind
    url_env: str | None = None
    secret_env: str | None = None
    to: tuple[str, ...] = ()
    smtp_url_env: str | None = None
    sender: str | None = None
    #: Whether the channel may send to an ``http://`` URL (in clear); off unless the file says so.
    insecure: bool = False


def clear_text_refusal(channel: Channel, url: str) -> str | None:
    """Why the channel may not send to ``url``: an ``http://`` URL without ``insecure: true``.

    In clear, the alert, its signature (replayable within its window) and a Slack webhook's path,
    which is its secret, are readable and changeable on every network between. Loopback is not
    exempt: "127.0.0.1" in a variable is often a proxy or a tunnel's end, and the file's reviewer
    should see the exception written down.
    """
    try:
        scheme = urlsplit(url).scheme  # as the sender reads it: lower case, leading blanks dropped
    except ValueError:
        return None  # not a URL at all: refused as that where it is used
    if channel.insecure or scheme != "http":
        return None
    return (
        f"channels.{channel.name}.url_env: {channel.url_env} is an http:// URL; alerts are sent over https:// "
        f"only, unless the channel says insecure: true (sent in clear, readable and changeable on the way)"
    )


def load_channels(path: str | None) -> dict[str, Channel]:
    """The channels of the file at ``path`` by name (``None``: no file, no channels).

    Raise :class:`ConfigError` naming the file and the field for anything unusable.
    """
    if path is None:
        return {}
    document = _read(path)
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: must be a mapping with 'channels:', got {type(document).__name__}")
    unknown = sorted(map(str, set(document) - {"channels"}))
    if unknown:
        raise ConfigError(f"{path}: {unknown[0]}: unknown field; the file holds 'channels:' only")
    entries = document.get("channels") or {}
    if not isinstance(entries, dict):
        raise ConfigError(f"{path}: channels: must be a mapping of channel names to channels")
    if len(entries) > MAX_CHANNELS:
        raise ConfigError(f"{path}: channels: at most {MAX_CHANNELS} channels, got {len(entries)}")
    return {name: _channel(path, name, fields) for name, fields in entries.items()}


def channel_names(settings: Settings) -> frozenset[str]:
    """Names definitions may use in ``alerts.channels`` (raises :class:`ConfigError` for a bad file)."""
    return frozenset(load_channels(settings.alert_channels_file))


def _read(path: str) -> Any:
    try:
        with open(path, "rb") as stream:
            data = stream.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"CHORDBEAT_ALERT_CHANNELS: {path} cannot be read ({exc.strerror})") from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"{path}: is larger than {MAX_FILE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: is not UTF-8 text (byte {exc.start})") from None
    try:
        return read_yaml(text)
    except YamlMistake as exc:
        raise ConfigError(f"{path}: {exc}") from None


def _channel(path: str, name: Any, fields: Any) -> Channel:
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ConfigError(
            f"{path}: channels: the name {short_repr(name)} is not a channel name "
            "(1 to 32 of a-z, 0-9, '_' and '-', starting with a letter or digit)"
        )
    where = f"{path}: channels.{name}"
    if not isinstance(fields, dict):
        raise ConfigError(f"{where}: must be a mapping with 'kind:', got {short_repr(fields)}")
    kind = fields.get("kind")
    if kind not in _FIELDS:
        raise ConfigError(f"{where}.kind: must be one of {sorted(_FIELDS)}, got {short_repr(kind)}")
    for key in fields:
        if key in _SECRET_FIELDS:
            raise ConfigError(
                f"{where}.{key}: secrets and URLs are never written in the file; "
                f"name the environment variable holding it with {_SECRET_FIELDS[key]}"
            )
        if key not in _FIELDS[kind]:
            raise ConfigError(f"{where}.{key}: unknown field for a {kind} channel (fields: {sorted(_FIELDS[kind])})")
    for key in sorted(_REQUIRED[kind] - set(fields)):
        raise ConfigError(f"{where}.{key}: missing; a {kind} channel needs it")
    return Channel(
        name=name,
        kind=kind,
        url_env=_variable(where, "url_env", fields.get("url_env")),
        secret_env=_variable(where, "secret_env", fields.get("secret_env")),
        to=_recipients(where, fields.get("to")),
        smtp_url_env=(
            _variable(where, "smtp_url_env", fields.get("smtp_url_env") or DEFAULT_SMTP_URL_ENV)
            if kind == "email"
            else None
        ),
        sender=_address(f"{where}.sender", fields.get("sender") or DEFAULT_SENDER) if kind == "email" else None,
        insecure=_flag(f"{where}.insecure", fields.get("insecure", False)),
    )


def _flag(where: str, value: Any) -> bool:
    # Only YAML's true and false: "yes" or 1 is more likely a mistake than a decision.
    if isinstance(value, bool):
        return value
    raise ConfigError(f"{where}: must be true or false, got {short_repr(value)}")


def _variable(where: str, key: str, value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str) and VARIABLE_PATTERN.fullmatch(value):
        return value
    # The value is never echoed: it may well be the secret itself.
    looks_like = "a URL" if isinstance(value, str) and "://" in value else "not a variable name"
    raise ConfigError(
        f"{where}.{key}: must name an environment variable (upper-case letters, digits and '_', "
        f"like OPS_WEBHOOK_URL), got {looks_like}; secrets and URLs are never written in the file"
    )


def _recipients(where: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}.to: must be a list of email addresses, got {short_repr(value)}")
    if len(value) > MAX_RECIPIENTS:
        raise ConfigError(f"{where}.to: at most {MAX_RECIPIENTS} addresses, got {len(value)}")
    return tuple(dict.fromkeys(_address(f"{where}.to", address) for address in value))


def _address(where: str, value: Any) -> str:
    if isinstance(value, str) and len(value) <= 254 and ADDRESS_PATTERN.fullmatch(value):
        return value
    raise ConfigError(f"{where}: {short_repr(value)} is not a plain email address (name@example.com)")
