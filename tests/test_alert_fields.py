"""A definition's ``deadlines`` and ``alerts``: every mistake at once naming the field, only channel
names (never a URL, an address or a secret, which the error does not repeat), channels checked
against the deployment's file, and the fields kept through apply, get, the schedule file and
``definition_of``."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from celery import Celery
from click.testing import CliRunner
from sqlalchemy import select

from celeryapp.alerting import messages
from celeryapp.alerting.channels import load_channels
from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.domain.alert_fields import MAX_CHANNELS, read_once
from celeryapp.domain.definition import AlertRules, Deadlines
from celeryapp.domain.step_policy import StepRules
from celeryapp.domain.strict_yaml import StrictLoader
from celeryapp.domain.validation import parse_definition, parse_definitions
from celeryapp.errors import ConfigError, DefinitionError
from celeryapp.interfaces.cli import main
from celeryapp.scheduling.schedule_file import apply_file, load_file
from celeryapp.states import AlertKind
from models import Schedule, transaction
from models.definitions import definition_of
from tests.support.helpers import call, set_field, step

KNOWN_ONLY = StepRules.without_policy({"chordbeat.examples.sleep"}.__contains__)
#: The channels of the deployment in these tests.
DEFINED = frozenset({"ops-webhook", "ops-slack", "ops-mail"})
CHANNELS_FILE = """\
channels:
  ops-webhook: {kind: webhook, url_env: OPS_WEBHOOK_URL, secret_env: OPS_WEBHOOK_SECRET}
  ops-slack:   {kind: slack, url_env: OPS_SLACK_URL}
  ops-mail:    {kind: email, to: ["ops@example.com"], smtp_url_env: CHORDBEAT_SMTP_URL}
"""
SECRET_URL = "https://hooks.slack.com/services/T000/B000/s3cr3tt0k3n"


def valid() -> dict[str, Any]:
    return {
        "name": "nightly-hr-sync",
        "cron": "0 2 * * *",
        "timezone": "Europe/London",
        "steps": [step("import")],
        "deadlines": {"start_within": 900, "finish_by": "06:00"},
        "alerts": {"channels": ["ops-webhook", "ops-mail"], "on": ["failed", "late"]},
    }


def with_change(path: str, value: Any) -> dict[str, Any]:
    return set_field(copy.deepcopy(valid()), path, value)


def known(names: frozenset[str] | None = DEFINED) -> Callable[[], frozenset[str] | None]:
    return lambda: names


#: What the deployment's file defines, as the apply paths ask it.
ALL_DEFINED: Callable[[], frozenset[str] | None] = known()


def errors_of(definition: Any, channels: Callable[[], frozenset[str] | None] | None = ALL_DEFINED) -> dict[str, str]:
    with pytest.raises(DefinitionError) as caught:
        parse_definition(definition, rules=KNOWN_ONLY, channels=channels)
    return {e.field: e.reason for e in caught.value.errors}


def test_the_fields_read_back_as_written_and_on_defaults_to_every_kind() -> None:
    parsed = parse_definition(valid(), rules=KNOWN_ONLY, channels=known())
    assert parsed.deadlines == Deadlines(start_within_s=900.0, finish_by="06:00")
    assert parsed.alerts == AlertRules(channels=("ops-webhook", "ops-mail"), on=(AlertKind.FAILED, AlertKind.LATE))
    out = parsed.to_json()
    assert out["deadlines"] == {"start_within": 900, "finish_by": "06:00"}
    assert out["alerts"] == {"channels": ["ops-webhook", "ops-mail"], "on": ["failed", "late"]}
    assert parse_definition(out, rules=KNOWN_ONLY, channels=known()) == parsed
    # Absent or null: none, and the schedule object says null.
    bare = {k: v for k, v in valid().items() if k not in ("deadlines", "alerts")}
    plain = parse_definition(bare, rules=KNOWN_ONLY, channels=known(None))
    assert plain.deadlines is None and plain.alerts is None
    assert plain.to_json()["deadlines"] is None and plain.to_json()["alerts"] is None
    assert parse_definition({**bare, "deadlines": None, "alerts": None}, rules=KNOWN_ONLY) == plain
    every = parse_definition(with_change("alerts/on", KeyError), rules=KNOWN_ONLY, channels=known())
    assert every.alerts is not None and [k.value for k in every.alerts.on] == ["failed", "dead", "missed", "late"]
    # Only finish_within, with alerts but no late: fine.
    only = parse_definition(
        {**bare, "deadlines": {"finish_within": 7200.5}, "alerts": {"channels": ["ops-slack"], "on": ["dead"]}},
        rules=KNOWN_ONLY,
        channels=known(),
    )
    assert only.deadlines == Deadlines(finish_within_s=7200.5) and only.to_json()["deadlines"] == {
        "finish_within": 7200.5
    }


@pytest.mark.parametrize(
    ("path", "value", "field", "reason"),
    [
        ("deadlines", "06:00", "deadlines", "must be an object, got string"),
        ("deadlines", {}, "deadlines", "must give at least one of"),
        ("deadlines/start_within", float("nan"), "deadlines.start_within", "got NaN"),
        ("deadlines/start_within", float("inf"), "deadlines.start_within", "must be between"),
        ("deadlines/start_within", True, "deadlines.start_within", "must be a number of seconds, got boolean"),
        ("deadlines/start_within", -5, "deadlines.start_within", "1 and 604800 seconds (7 days), got -5"),
        ("deadlines/start_within", 0, "deadlines.start_within", "must be between"),
        ("deadlines/start_within", 10**30, "deadlines.start_within", "must be between"),
        ("deadlines/start_within", "900", "deadlines.start_within", "must be a number of seconds, got string"),
        ("deadlines/finish_within", 600, "deadlines.start_within", "must not be later than finish_within"),
        ("deadlines/finish_by", "24:00", "deadlines.finish_by", "from 00:00 to 23:59, got '24:00'"),
        ("deadlines/finish_by", "6:00 ", "deadlines.finish_by", "got '6:00 '"),
        ("deadlines/finish_by", "06:60", "deadlines.finish_by", "got '06:60'"),
        ("deadlines/finish_by", "6:00", "deadlines.finish_by", "got '6:00'"),
        ("deadlines/finish_by", "06:00:00", "deadlines.finish_by", "HH:MM"),
        ("deadlines/finish_by", "\uff10\uff16:\uff10\uff10", "deadlines.finish_by", "HH:MM"),  # full-width digits
        ("deadlines/finish_by", 600, "deadlines.finish_by", "must be a time written HH:MM, got int"),
        ("deadlines/finish_by", "06:00\n", "deadlines.finish_by", "HH:MM"),
        # What YAML 1.1 makes of an unquoted 22:30 and 6:00 (sexagesimal numbers).
        ("deadlines/finish_by", 1350, "deadlines.finish_by", 'in YAML quote it, finish_by: "22:30"'),
        ("deadlines/finish_by", 360, "deadlines.finish_by", '"06:00" (unquoted, 6:00 is read as 360)'),
        ("deadlines/finish_in", 5, "deadlines.finish_in", "unknown field (allowed: finish_by, finish_within"),
        ("alerts", ["ops-mail"], "alerts", "must be an object, got list"),
        ("alerts/channels", KeyError, "alerts.channels", "is required (alerts.on asks for alerts"),
        ("alerts/channels", "ops-mail", "alerts.channels", "must be a list of channel names, got string"),
        ("alerts/channels", [], "alerts.channels", "must name at least one channel"),
        ("alerts/channels", ["ops-mail", "ops-mail"], "alerts.channels[1]", "named twice (also alerts.channels[0])"),
        ("alerts/channels", [7], "alerts.channels[0]", "must be a channel name, got int"),
        ("alerts/channels", [None], "alerts.channels[0]", "must be a channel name, got null"),
        ("alerts/channels", [["ops-mail"]], "alerts.channels[0]", "must be a channel name, got list"),
        ("alerts/channels", ["Ops-Mail"], "alerts.channels[0]", "channel names are lower case"),
        ("alerts/channels", ["ops mail"], "alerts.channels[0]", "is not a channel name"),
        ("alerts/channels", ["x" * 33], "alerts.channels[0]", "1 to 32 of a-z"),
        ("alerts/channels", ["-ops"], "alerts.channels[0]", "starting with a letter or digit"),
        ("alerts/channels", ["ops-mail\n"], "alerts.channels[0]", "is not a channel name"),
        ("alerts/channels", ["ops-pager"], "alerts.channels[0]", "'ops-pager' is not defined in the"),
        ("alerts/on", [], "alerts.on", "must name at least one of failed, dead, missed, late"),
        ("alerts/on", "failed", "alerts.on", "must be a list of alert kinds"),
        ("alerts/on", ["failed", "failed"], "alerts.on[1]", "'failed' is named twice (also alerts.on[0])"),
        ("alerts/on", ["failure"], "alerts.on[0]", "must be one of failed, dead, missed, late, got 'failure'"),
        ("alerts/on", ["FAILED"], "alerts.on[0]", "must be one of"),
        ("alerts/on", [1], "alerts.on[0]", "must be one of failed, dead, missed, late, got int"),
        ("alerts/on", ["resolved"], "alerts.on[0]", "it follows 'late'"),
        ("alerts/on", ["test"], "alerts.on[0]", "chordbeat alerts test CHANNEL"),
        ("alerts/on", ["failed"] * 5, "alerts.on", "at most once, got 5 values"),
        ("alerts/when", ["failed"], "alerts.when", "unknown field (allowed: channels, on)"),
        # Look-alikes of the two fields are unknown fields at the top, not silently ignored.
        ("deadline", {"finish_by": "06:00"}, "deadline", "unknown field (allowed: alerts,"),
        ("alert", {"channels": ["ops-mail"]}, "alert", "unknown field"),
    ],
)
def test_each_mistake_is_refused_naming_the_field(path: str, value: Any, field: str, reason: str) -> None:
    errors = errors_of(with_change(path, value))
    assert field in errors, errors
    assert reason in errors[field]


def test_every_mistake_of_both_fields_is_reported_at_once() -> None:
    definition = with_change("deadlines", {"start_within": -1, "finish_within": "2h", "finish_by": "6:00", "x": 1})
    definition["alerts"] = {"channels": ["ops-mail", "Bad Name", "ops-mail"], "on": ["failed", "never"], "to": "x"}
    definition["cron"] = "61 * * * *"
    errors = errors_of(definition)
    assert set(errors) == {
        "cron",
        "deadlines.x",
        "deadlines.start_within",
        "deadlines.finish_within",
        "deadlines.finish_by",
        "alerts.to",
        "alerts.channels[1]",
        "alerts.channels[2]",
        "alerts.on[1]",
    }, errors


@pytest.mark.parametrize(
    ("written", "why"),
    [
        (SECRET_URL, "is a URL (not shown)"),
        ("hooks.slack.com/services/T000/B000/s3cr3tt0k3n", "is not a channel name (not shown: it may be a secret)"),
        ("mailto:oncall@example.com", "is a URL (not shown)"),
        ("oncall@example.com", "is an email address (not shown)"),
        ("smtp://user:s3cr3tt0k3n@mail.example.com:25", "is a URL (not shown)"),
        ("xoxb-1234-s3cr3tt0k3n-ABCDEFGHIJKLMNOPQRSTUVWX", "it may be a secret"),
    ],
)
def test_a_url_address_or_secret_where_a_channel_name_belongs_is_refused_and_not_repeated(
    written: str, why: str
) -> None:
    errors = errors_of(with_change("alerts/channels", ["ops-mail", written]))
    assert list(errors) == ["alerts.channels[1]"]
    assert why in errors["alerts.channels[1]"] and "CHORDBEAT_ALERT_CHANNELS" in errors["alerts.channels[1]"]
    assert "s3cr3t" not in str(errors) and "oncall" not in str(errors)
    # Also as the whole list's value, and as a field of its own.
    alone = errors_of(with_change("alerts/channels", written))
    assert "CHORDBEAT_ALERT_CHANNELS" in alone["alerts.channels"] and "s3cr3t" not in str(alone)
    as_field = errors_of(with_change("alerts", {"channels": ["ops-mail"], "url": written, "webhook": written}))
    assert set(as_field) == {"alerts.url", "alerts.webhook"}
    assert all("define channels in the CHORDBEAT_ALERT_CHANNELS file" in r for r in as_field.values())
    assert "s3cr3t" not in str(as_field)


def test_channels_must_be_defined_in_the_deployments_file() -> None:
    definition = with_change("alerts/channels", ["ops-mail", "pager", "ops-webhook", "sms"])
    errors = errors_of(definition)
    assert set(errors) == {"alerts.channels[1]", "alerts.channels[3]"}
    assert "it defines ops-mail, ops-slack, ops-webhook" in errors["alerts.channels[1]"]
    many = frozenset(f"c{i:02}" for i in range(25))
    listed = errors_of(definition, known(many))["alerts.channels[0]"]
    assert "c09 and 15 more" in listed and "c10" not in listed
    assert "it defines no channel" in errors_of(definition, known(frozenset()))["alerts.channels[0]"]


def test_without_the_channels_variable_no_definition_may_name_a_channel() -> None:
    errors = errors_of(valid(), known(None))
    assert list(errors) == ["alerts.channels"]
    assert "CHORDBEAT_ALERT_CHANNELS is not set" in errors["alerts.channels"]
    # Deadlines alone need no channel.
    alone = parse_definition(with_change("alerts", KeyError), rules=KNOWN_ONLY, channels=known(None))
    assert alone.deadlines is not None and alone.alerts is None


def test_a_channels_file_that_cannot_be_used_refuses_only_definitions_naming_channels() -> None:
    asked: list[int] = []

    def broken() -> frozenset[str] | None:
        asked.append(1)
        raise ConfigError("/etc/chordbeat/channels.yaml: channels.ops-mail.kind: must be one of ...")

    errors = errors_of(valid(), broken)
    assert "the CHORDBEAT_ALERT_CHANNELS file cannot be used: /etc/chordbeat/channels.yaml" in errors["alerts.channels"]
    parse_definition(with_change("alerts", KeyError), rules=KNOWN_ONLY, channels=broken)
    assert len(asked) == 1, "a definition without alerts does not read the file"


def test_late_without_deadlines_is_said_and_a_schedule_files_definitions_read_the_channels_once() -> None:
    errors = errors_of(with_change("deadlines", KeyError))
    assert errors == {"alerts.on[1]": errors["alerts.on[1]"]} and "'late' needs deadlines" in errors["alerts.on[1]"]
    # on left out asks for every kind; without deadlines late simply never fires.
    assert parse_definition(
        set_field(with_change("deadlines", KeyError), "alerts/on", KeyError), rules=KNOWN_ONLY, channels=known()
    ).alerts
    reads: list[int] = []

    def counted() -> frozenset[str] | None:
        reads.append(1)
        return DEFINED

    items = [{**valid(), "name": f"s{i}"} for i in range(5)]
    assert len(parse_definitions(items, rules=KNOWN_ONLY, channels=counted)) == 5
    assert len(reads) == 1
    cached = read_once(counted)
    assert cached() == cached() == DEFINED and len(reads) == 2


def test_hostile_shapes_are_refused_within_the_definitions_caps() -> None:
    deep: Any = "06:00"
    for _ in range(200):
        deep = {"finish_by": deep}
    errors = errors_of(with_change("deadlines", deep))
    assert any(f.startswith("deadlines") for f in errors), errors
    too_many = [f"c{i}" for i in range(MAX_CHANNELS + 1)]
    assert f"at most {MAX_CHANNELS} channels" in errors_of(with_change("alerts/channels", too_many))["alerts.channels"]
    huge = errors_of(with_change("alerts/channels", ["x" * 100_000]))
    assert len(huge["alerts.channels[0]"]) < 300
    odd_keys = errors_of(with_change("alerts", {"channels": ["ops-mail"], "\x1b[2J": 1}))
    assert any("unknown field" in r for r in odd_keys.values()) and not any("\x1b" in f for f in odd_keys)


# --- stored: through the service task, the schedule file and definition_of --------------------


@pytest.fixture
def settings(settings: Settings, tmp_path: Path) -> Settings:
    """The deployment of these tests: the contract's example channels file."""
    path = tmp_path / "channels.yaml"
    path.write_text(CHANNELS_FILE)
    return dataclasses.replace(settings, alert_channels_file=str(path))


def stored(app: ChordbeatCelery, name: str) -> tuple[Any, Any, Any]:
    with transaction(app.settings.database_url) as session:
        schedule = session.scalars(select(Schedule).where(Schedule.name == name)).one()
        definition = definition_of(schedule)
        return schedule.deadlines, schedule.alerts, (definition.deadlines, definition.alerts)


def test_apply_and_get_give_the_fields_back_and_reapplying_them_changes_nothing(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    created = call(client, "chordbeat.apply_schedule", definition=valid())
    assert created["deadlines"] == {"start_within": 900, "finish_by": "06:00"}
    assert created["alerts"] == {"channels": ["ops-webhook", "ops-mail"], "on": ["failed", "late"]}
    # get_schedule adds the runs' counts (counted only there, not for every apply).
    got = call(client, "chordbeat.get_schedule", name="nightly-hr-sync")
    assert got.pop("runs")["total"] == 0 and got == created
    deadlines, alerts, parsed = stored(app, "nightly-hr-sync")
    assert (deadlines, alerts) == (created["deadlines"], created["alerts"])
    assert parsed == (Deadlines(start_within_s=900.0, finish_by="06:00"), created_rules(created))
    again = call(client, "chordbeat.apply_schedule", definition=valid())
    assert again == created and last_change(client) == "unchanged"
    # A change of either field is a change; null removes them.
    changed = call(client, "chordbeat.apply_schedule", definition=with_change("deadlines/finish_by", "05:30"))
    assert changed["deadlines"]["finish_by"] == "05:30" and last_change(client) == "changed"
    assert call(client, "chordbeat.apply_schedule", definition=with_change("alerts/on", ["late", "failed"]))
    assert last_change(client) == "changed", "the order of on is kept as written"
    bare = call(client, "chordbeat.apply_schedule", definition={**valid(), "deadlines": None, "alerts": None})
    assert bare["deadlines"] is None and bare["alerts"] is None
    assert stored(app, "nightly-hr-sync") == (None, None, (None, None))


def last_change(client: Celery) -> str:
    newest = call(client, "chordbeat.list_audit", limit=1)[0]
    assert newest["action"] == "apply"
    return str(newest["detail"]["change"])


def created_rules(created: dict[str, Any]) -> AlertRules:
    return AlertRules(tuple(created["alerts"]["channels"]), tuple(AlertKind(k) for k in created["alerts"]["on"]))


def test_the_service_refuses_every_mistake_and_unknown_channels_storing_nothing(
    app: ChordbeatCelery, worker: Any, client: Celery
) -> None:
    definition = with_change("alerts/channels", ["ops-mail", SECRET_URL, "pager"])
    definition["deadlines"]["finish_by"] = "24:00"
    with pytest.raises(Exception) as caught:
        call(client, "chordbeat.apply_schedule", definition=definition)
    message = str(caught.value)
    assert "deadlines.finish_by: " in message and "alerts.channels[1]: is a URL (not shown)" in message
    assert "s3cr3t" not in message
    with pytest.raises(Exception, match=r"alerts\.channels\[0\]: 'pager' is not defined in the CHORDBEAT_ALERT"):
        call(client, "chordbeat.apply_schedule", definition=with_change("alerts/channels", ["pager"]))
    assert call(client, "chordbeat.list_schedules") == []


def test_the_schedule_file_keeps_the_fields_and_checks_the_channels(app: ChordbeatCelery, tmp_path: Path) -> None:
    path = tmp_path / "hr.yaml"
    path.write_text(yaml.safe_dump({"schedules": [valid()]}))
    runner = CliRunner()
    applied = runner.invoke(main, ["apply", "--json", str(path)])
    assert applied.exit_code == 0, applied.output
    assert json.loads(applied.stdout)["added"] == ["nightly-hr-sync"]
    deadlines, alerts, _ = stored(app, "nightly-hr-sync")
    assert deadlines == {"start_within": 900, "finish_by": "06:00"}
    assert alerts["channels"] == ["ops-webhook", "ops-mail"]
    # The same file again: nothing changed; a changed channel list is a change of alerts.
    assert apply_file(app, path).summary() == "no changes"
    path.write_text(yaml.safe_dump({"schedules": [with_change("alerts/channels", ["ops-slack"])]}))
    diff = apply_file(app, path, dry_run=True)
    assert diff.changed == ["nightly-hr-sync"] and diff.fields == {"nightly-hr-sync": ["alerts"]}
    # An unknown channel refuses the whole file, naming the schedule and the field.
    path.write_text(yaml.safe_dump({"schedules": [with_change("alerts/channels", ["ops-pager"])]}))
    refused = runner.invoke(main, ["apply", str(path)])
    assert refused.exit_code == 1
    said = " ".join(refused.stderr.split())  # wrapped at the terminal's width
    assert "schedules[0] (nightly-hr-sync).alerts.channels[0]: 'ops-pager' is not defined in the" in said
    assert stored(app, "nightly-hr-sync")[1]["channels"] == ["ops-webhook", "ops-mail"]


def test_without_the_channels_variable_apply_refuses_alerts_naming_the_variable(
    app: ChordbeatCelery, tmp_path: Path
) -> None:
    app.apply_settings(dataclasses.replace(app.settings, alert_channels_file=None))
    path = tmp_path / "hr.yaml"
    path.write_text(yaml.safe_dump({"schedules": [valid()]}))
    with pytest.raises(DefinitionError, match=r"alerts\.channels: names channels, but CHORDBEAT_ALERT_CHANNELS is not"):
        apply_file(app, path)
    path.write_text(yaml.safe_dump({"schedules": [with_change("alerts", KeyError)]}))
    assert apply_file(app, path).added == ["nightly-hr-sync"]


# --- docs/alerts.md's worked example is what chordbeat takes --------------------------------------

DOCS = Path(__file__).resolve().parent.parent / "docs" / "alerts.md"
DEPLOYED_CHANNELS = Path(__file__).resolve().parent.parent / "deploy" / "alert-channels.yaml"


def doc_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOCS.read_text(), re.S)


def test_the_worked_example_applies_with_the_deployed_channels_file(tmp_path: Path) -> None:
    schedule_file, channels_file = (b for b in doc_blocks("yaml") if b.startswith(("schedules:", "channels:")))
    assert yaml.safe_load(channels_file) == yaml.safe_load(DEPLOYED_CHANNELS.read_text())
    names = frozenset(load_channels(str(DEPLOYED_CHANNELS)))
    # Read as chordbeat reads a schedule file: its plain `on:` is the key "on", not YAML 1.1's True.
    (tmp_path / "hr.yaml").write_text(schedule_file)
    (hr,) = load_file(tmp_path / "hr.yaml", rules=None, channels=lambda: names)
    assert (hr.name, hr.timezone, hr.deadlines) == (
        "nightly-hr-sync",
        "Europe/London",
        Deadlines(start_within_s=900.0, finish_by="06:00"),
    )
    assert hr.alerts is not None and {AlertKind.FAILED, AlertKind.LATE} <= set(hr.alerts.on)
    # The refusal the page shows is the one chordbeat gives.
    shown = " ".join(next(b for b in doc_blocks("text") if b.startswith("Error:")).split())
    (tmp_path / "hr.yaml").write_text(schedule_file.replace("ops-mail]", "ops-pager]"))
    with pytest.raises(DefinitionError) as caught:
        load_file(tmp_path / "hr.yaml", rules=None, channels=lambda: names)
    assert shown == f"Error: {caught.value}"


def test_the_signature_check_on_the_page_accepts_the_senders_signature_only_within_the_window() -> None:
    (snippet,) = doc_blocks("python")
    scope: dict[str, Any] = {}
    exec(snippet, scope)
    check = scope["is_from_chordbeat"]
    assert scope["REPLAY_WINDOW_S"] == messages.REPLAY_WINDOW_S
    body, secret, now = json.dumps({"id": "failed/x/2026-11-25T02:00:00.000Z"}).encode(), "k" * 32, 1_795_000_000
    signature = messages.timestamped_signature(now, body, secret)
    assert check(body, str(now), signature, secret, now=now + 299)
    assert not check(body + b" ", str(now), signature, secret, now=now)
    assert not check(body, str(now), signature, "other", now=now)
    assert not check(body, str(now), signature, secret, now=now + messages.REPLAY_WINDOW_S + 1), "a replay"
    assert not check(body, str(now + 400), signature, secret, now=now + 400), "a timestamp moved on"
    assert not check(body, str(now), messages.signature(body, secret), secret, now=now), "body-only"
    assert not check(body, "\uff11795000000", signature, secret, now=now)


def test_a_schedule_files_plain_on_key_is_the_name_on_and_values_keep_their_yaml_meaning() -> None:
    text = "alerts: {on: [late], 'yes': 1, off: 2, No: 3, true: 4}\nenabled: yes\nflag: on\n"
    loaded = yaml.load(text, StrictLoader)
    assert loaded == {"alerts": {"on": ["late"], "yes": 1, "off": 2, "No": 3, True: 4}, "enabled": True, "flag": True}
