"""The alert channels file: what it may say, and hostile files refused naming the file and field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from celeryapp.alerting.channels import MAX_CHANNELS, Channel, channel_names, load_channels
from celeryapp.config import Settings
from celeryapp.domain.limits import MAX_FILE_BYTES
from celeryapp.errors import ConfigError

CONTRACT_EXAMPLE = """\
channels:
  ops-webhook: {kind: webhook, url_env: OPS_WEBHOOK_URL, secret_env: OPS_WEBHOOK_SECRET}
  ops-slack:   {kind: slack, url_env: OPS_SLACK_URL}
  ops-mail:    {kind: email, to: ["ops@example.com"], smtp_url_env: CHORDBEAT_SMTP_URL}
"""


def write(tmp_path: Path, text: str | bytes) -> str:
    path = tmp_path / "channels.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return str(path)


def refusal(tmp_path: Path, text: str | bytes) -> str:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_channels(path)
    message = str(caught.value)
    assert message.startswith(path), message
    return message


def test_the_contract_example_loads(tmp_path: Path) -> None:
    channels = load_channels(write(tmp_path, CONTRACT_EXAMPLE))
    assert channels == {
        "ops-webhook": Channel("ops-webhook", "webhook", url_env="OPS_WEBHOOK_URL", secret_env="OPS_WEBHOOK_SECRET"),
        "ops-slack": Channel("ops-slack", "slack", url_env="OPS_SLACK_URL"),
        "ops-mail": Channel(
            "ops-mail",
            "email",
            to=("ops@example.com",),
            smtp_url_env="CHORDBEAT_SMTP_URL",
            sender="chordbeat@localhost",
        ),
    }
    settings = Settings(alert_channels_file=write(tmp_path, CONTRACT_EXAMPLE))
    assert channel_names(settings) == {"ops-webhook", "ops-slack", "ops-mail"}


def test_no_file_or_an_empty_one_means_no_channels(tmp_path: Path) -> None:
    assert load_channels(None) == {}
    assert channel_names(Settings()) == frozenset()
    assert load_channels(write(tmp_path, "")) == {}
    assert load_channels(write(tmp_path, "channels:\n")) == {}


def test_email_defaults_and_sender(tmp_path: Path) -> None:
    text = "channels:\n  m: {kind: email, to: a@b.example, sender: cb@ops.example}\n"
    assert load_channels(write(tmp_path, text))["m"] == Channel(
        "m", "email", to=("a@b.example",), smtp_url_env="CHORDBEAT_SMTP_URL", sender="cb@ops.example"
    )


def test_a_missing_file_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^CHORDBEAT_ALERT_CHANNELS: .*nope.yaml cannot be read"):
        load_channels(str(tmp_path / "nope.yaml"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "channels:\n  x: {kind: pager, url_env: X}\n",
            r"channels\.x\.kind: must be one of \['email', 'slack', 'webhook'\], got 'pager'",
        ),
        ("channels:\n  x: {url_env: X}\n", r"channels\.x\.kind: must be one of"),
        ("channels:\n  x: {kind: webhook}\n", r"channels\.x\.url_env: missing; a webhook channel needs it"),
        (
            "channels:\n  x: {kind: slack, secret_env: S}\n",
            r"channels\.x\.secret_env: unknown field for a slack channel",
        ),
        ("channels:\n  x: {kind: email}\n", r"channels\.x\.to: missing"),
        ("channels:\n  x: {kind: email, to: []}\n", r"channels\.x\.to: must be a list of email addresses"),
        (
            "channels:\n  x: {kind: email, to: ['a@b.example\\r\\nBcc: c@d.example']}\n",
            r"channels\.x\.to: .* is not a plain email address",
        ),
        (
            "channels:\n  x: {kind: email, to: ['Ops <a@b.example>']}\n",
            r"channels\.x\.to: .* is not a plain email address",
        ),
        (
            "channels:\n  x: {kind: email, to: [a@b.example], sender: 'x@y.example, z@w.example'}\n",
            r"channels\.x\.sender: ",
        ),
        ("channels:\n  x: webhook\n", r"channels\.x: must be a mapping with 'kind:'"),
        ("channels:\n  - x\n", r"channels: must be a mapping of channel names"),
        ("- channels\n", r"must be a mapping with 'channels:', got list"),
        ("just text\n", r"must be a mapping with 'channels:', got str"),
        ("channels: {}\nschedules: []\n", r"schedules: unknown field"),
        ("channels:\n  a: {kind: slack, url_env: A}\n  a: {kind: slack, url_env: B}\n", r"duplicate key 'a'"),
        ("base: &b {kind: slack, url_env: A}\nchannels:\n  a: *b\n", r"anchors"),
        ("channels: [\n", r"line \d+, column \d+"),
    ],
)
def test_bad_channels_are_refused_naming_the_field(tmp_path: Path, text: str, expected: str) -> None:
    assert_matches(refusal(tmp_path, text), expected)


@pytest.mark.parametrize("name", ["Ops", "-ops", "ops hook", "a" * 33, "", "ops.hook", "ops/hook", "1.5"])
def test_bad_channel_names_are_refused(tmp_path: Path, name: str) -> None:
    message = refusal(tmp_path, f"channels:\n  {name!r}: {{kind: slack, url_env: A}}\n")
    assert "is not a channel name" in message


@pytest.mark.parametrize("key", ["1", "true", "null", "2026-11-24"])
def test_names_yaml_reads_as_other_than_text_are_refused(tmp_path: Path, key: str) -> None:
    assert "is not a channel name" in refusal(tmp_path, f"channels:\n  {key}: {{kind: slack, url_env: A}}\n")


SECRET = "hunter2-s3cret"
URL = "https://hooks.example.com/services/T000/B000/XXXXSECRETXXXX"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (f"channels:\n  ops: {{kind: webhook, url_env: '{URL}'}}\n", "channels.ops.url_env"),
        (f"channels:\n  ops: {{kind: webhook, url_env: A, secret_env: {SECRET}}}\n", "channels.ops.secret_env"),
        (f"channels:\n  ops: {{kind: slack, url: '{URL}'}}\n", "channels.ops.url"),
        (f"channels:\n  ops: {{kind: webhook, url_env: A, secret: {SECRET}}}\n", "channels.ops.secret"),
        (
            f"channels:\n  ops: {{kind: email, to: [a@b.example], smtp_url_env: 'smtp://u:{SECRET}@h:25'}}\n",
            "channels.ops.smtp_url_env",
        ),
        (f"channels:\n  ops: {{kind: email, to: [a@b.example], password: {SECRET}}}\n", "channels.ops.password"),
    ],
)
def test_urls_and_secrets_written_in_the_file_are_refused_and_not_echoed(tmp_path: Path, text: str, field: str) -> None:
    message = refusal(tmp_path, text)
    assert f": {field}: " in message, message
    assert "never written in the file" in message
    assert SECRET not in message and "XXXXSECRETXXXX" not in message


def test_a_huge_file_is_refused_unread(tmp_path: Path) -> None:
    message = refusal(tmp_path, b"channels:\n" + b"#" * MAX_FILE_BYTES)
    assert f"is larger than {MAX_FILE_BYTES} bytes" in message


def test_too_many_channels_are_refused(tmp_path: Path) -> None:
    lines = "".join(f"  c{i}: {{kind: slack, url_env: A}}\n" for i in range(MAX_CHANNELS + 1))
    assert f"at most {MAX_CHANNELS} channels" in refusal(tmp_path, "channels:\n" + lines)


def test_binary_is_refused(tmp_path: Path) -> None:
    assert "is not UTF-8 text" in refusal(tmp_path, b"channels:\n  \xff\xfe: 1\n")


def assert_matches(message: str, pattern: str) -> None:
    assert re.search(pattern, message), message
