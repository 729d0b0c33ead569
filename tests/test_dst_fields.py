"""A definition's ``dst``: read from untrusted JSON naming each mistake, stored, given back, and
used alike by every reader of a stored schedule (beat's entry, the fire, the deadline watch, the
previews)."""

from __future__ import annotations

import copy
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import select, update

from celeryapp.alerting.deadline_watch import _WATCHED
from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.domain.cadence import Cadence, cadence_of, next_fire_times
from celeryapp.domain.dst_rules import DstRules, Missing, Repeated
from celeryapp.domain.step_policy import StepRules
from celeryapp.domain.validation import parse_definition
from celeryapp.errors import DefinitionError
from celeryapp.interfaces.cli.schedules import _upcoming
from celeryapp.interfaces.objects import Alerting, schedule_json
from celeryapp.scheduling.beat_entries import ENTRY_COLUMNS, EntryFields, entry_name, sync_schedules
from celeryapp.scheduling.store import upsert_schedule
from celeryapp.scheduling.stored_entry import CadenceSchedule, CorruptEntry, ScheduleEntry, fire_of
from celeryapp.worker.firing import _ENTRY_AT, _FIRE_COLUMNS
from models import Schedule, ScheduleSource, transaction
from models.audit import BEAT
from models.definitions import definition_of
from models.versions import VersionOrigin
from tests.support import processes
from tests.support.helpers import call, set_field, step
from tests.support.terminals import in_pty, plain_lines

CHORDBEAT = str(Path(sys.executable).with_name("chordbeat"))
KNOWN_ONLY = StepRules.without_policy({"chordbeat.examples.sleep"}.__contains__)
T0 = datetime(2026, 10, 1, tzinfo=UTC)


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def valid() -> dict[str, Any]:
    return {
        "name": "nightly",
        "cron": "30 1 * * *",
        "timezone": "Europe/London",
        "steps": [step("load")],
        "dst": {"repeated": "last", "missing": "skip"},
    }


def errors_of(definition: Any) -> dict[str, str]:
    with pytest.raises(DefinitionError) as caught:
        parse_definition(definition, rules=KNOWN_ONLY)
    return {e.field: e.reason for e in caught.value.errors}


def test_the_field_reads_back_as_written() -> None:
    parsed = parse_definition(valid(), rules=KNOWN_ONLY)
    assert parsed.dst == DstRules(Repeated.LAST, Missing.SKIP)
    assert parsed.to_json()["dst"] == valid()["dst"]
    assert DstRules.from_json(parsed.to_json()["dst"]) == parsed.dst
    # Either key alone; the other case keeps the default rule (and is not written back).
    alone = parse_definition(set_field(valid(), "dst", {"missing": "shift"}), rules=KNOWN_ONLY)
    assert alone.dst == DstRules(missing=Missing.SHIFT) and alone.to_json()["dst"] == {"missing": "shift"}
    nulls = parse_definition(set_field(valid(), "dst", {"repeated": "both", "missing": None}), rules=KNOWN_ONLY)
    assert nulls.dst == DstRules(repeated=Repeated.BOTH)
    # Absent or null: the default rule; the schedule object says null.
    assert parse_definition(set_field(valid(), "dst", None), rules=KNOWN_ONLY).dst is None
    bare = parse_definition(set_field(valid(), "dst", KeyError), rules=KNOWN_ONLY)
    assert bare.dst is None and bare.to_json()["dst"] is None


@pytest.mark.parametrize(
    ("path", "value", "field", "reason"),
    [
        ("dst", [], "dst", "must be an object, got list"),
        ("dst", "last", "dst", "must be an object, got str"),
        ("dst", {}, "dst", "must give repeated or missing (leave dst out for the default rule)"),
        ("dst/when", "first", "dst.when", "unknown field"),
        ("dst/repeated", "First", "dst.repeated", "must be one of first, last, both, got 'First'"),
        ("dst/repeated", True, "dst.repeated", "must be one of first, last, both, got bool"),
        ("dst/repeated", 1, "dst.repeated", "got int"),
        ("dst/repeated", float("nan"), "dst.repeated", "got float"),
        ("dst/repeated", ["first"], "dst.repeated", "got list"),
        ("dst/missing", "shift ", "dst.missing", "must be one of shift, skip, got 'shift '"),
        ("dst/missing", {"skip": True}, "dst.missing", "got object"),
    ],
)
def test_each_mistake_is_refused_naming_the_field(path: str, value: Any, field: str, reason: str) -> None:
    errors = errors_of(set_field(valid(), path, value))
    assert field in errors and reason in errors[field], errors


def test_hostile_values_are_refused_together_and_shortly() -> None:
    errors = errors_of(set_field(valid(), "dst", {"repeated": "x" * 100_000, "missing": "\x00", "extra": 1}))
    assert set(errors) == {"dst.repeated", "dst.missing", "dst.extra"}
    assert all(len(reason) < 300 for reason in errors.values()), errors


def test_an_interval_schedule_takes_no_dst_rule() -> None:
    definition = {**valid(), "every": 3600}
    del definition["cron"]
    assert errors_of(definition) == {
        "dst": "is for cron schedules only: an 'every' schedule counts absolute time, which a change of the"
        " clocks does not move"
    }
    # Without dst an interval is as before.
    del definition["dst"]
    assert parse_definition(definition, rules=KNOWN_ONLY).dst is None


def test_an_entry_without_dst_is_stored_as_before_and_a_bad_one_is_corrupt() -> None:
    plain = CadenceSchedule(Cadence(cron="30 1 * * *", every_s=None, timezone="Europe/London", anchor=T0))
    assert "dst" not in plain.encode()
    ruled = CadenceSchedule(
        Cadence(cron="30 1 * * *", every_s=None, timezone="Europe/London", anchor=T0, dst=DstRules(Repeated.BOTH))
    )
    assert ruled.encode()["dst"] == {"repeated": "both"}
    assert CadenceSchedule.decode(ruled.encode()).cadence == ruled.cadence
    for bad in ({"repeated": "sometimes"}, "both", [], {}, {"repeated": "both", "x": 1}):
        with pytest.raises(CorruptEntry, match="its dst is not a DST rule"):
            CadenceSchedule.decode({**ruled.encode(), "dst": bad})
    interval = {**ruled.encode(), "cron": None, "every": 60}
    with pytest.raises(CorruptEntry, match="its dst is not a DST rule of a cron"):
        CadenceSchedule.decode(interval)


#: The nightly 01:30 London schedule with repeated: last, missing: skip, around both 2026 changes:
#: 01:30 is skipped on 29 March and fires in the GMT pass on 25 October.
SPRING = (at("2026-03-27T12:00"), at("2026-03-30T12:00"))
SPRING_SLOTS = [at("2026-03-28T01:30"), at("2026-03-30T00:30")]
AUTUMN = (at("2026-10-24T12:00"), at("2026-10-26T12:00"))
AUTUMN_SLOTS = [at("2026-10-25T01:30"), at("2026-10-26T01:30")]


def slots(cadence: Cadence, window: tuple[datetime, datetime]) -> list[datetime]:
    found, more = cadence.slots_between(*window, cap=10)
    assert not more
    return found


def test_every_reader_of_the_stored_schedule_reckons_the_same_slots(app: ChordbeatCelery) -> None:
    """Beat's entry as stored in Redis, the fire's row, the deadline watch's row and the stored
    schedule give one cadence; the previews (the dashboard's, the CLI's from the schedule object)
    list the same times, and beat's fire message names the slot the rule gives."""
    definition = parse_definition(valid(), rules=KNOWN_ONLY)
    url = app.settings.database_url
    with transaction(url) as session:
        upsert_schedule(session, definition, source=ScheduleSource.API, now=T0, origin=VersionOrigin.of(BEAT))
    sync_schedules(app, ["nightly"])
    with transaction(url, read_only=True) as session:
        schedule = session.scalars(select(Schedule).where(Schedule.name == "nightly")).one()
        assert schedule.dst == valid()["dst"] and definition_of(schedule) == definition
        fire_row = session.execute(select(*_FIRE_COLUMNS).where(Schedule.name == "nightly")).one()
        # The watch's own columns (it reads schedules with alerts only).
        watched = session.execute(select(*_WATCHED.selected_columns).where(Schedule.name == "nightly")).one()
        entry_row = session.execute(select(*ENTRY_COLUMNS).where(Schedule.name == "nightly")).one()
        cadences = {
            "schedule": cadence_of(schedule),
            "fire": cadence_of(EntryFields(*fire_row[_ENTRY_AT:])),
            "watch": cadence_of(watched),
            "entry columns": cadence_of(EntryFields(*entry_row)),
        }
        dashboard = [t.astimezone(UTC) for t in next_fire_times(schedule, AUTUMN[0], 26)]
        shown = schedule_json(schedule, schedule.steps, Alerting())
    stored = ScheduleEntry.from_key(ScheduleEntry.generate_key(app, entry_name("nightly")), app=app)
    assert isinstance(stored.schedule, CadenceSchedule)
    cadences["beat entry"] = stored.schedule.cadence
    for reader, cadence in cadences.items():
        assert cadence.dst == DstRules(Repeated.LAST, Missing.SKIP), reader
        assert slots(cadence, SPRING) == SPRING_SLOTS, reader
        assert slots(cadence, AUTUMN) == AUTUMN_SLOTS, reader
    assert json.loads(json.dumps(shown))["dst"] == valid()["dst"]
    # The dashboard's preview starts at the stored next run (1 October); the CLI's from the object.
    assert dashboard[0] == at("2026-10-01T00:30") and dashboard[24:] == AUTUMN_SLOTS
    preview = _upcoming({**shown, "next_run_at": "2026-10-24T00:30:00Z"}, 3)
    assert [t.astimezone(UTC) for t in preview] == [at("2026-10-24T00:30"), *AUTUMN_SLOTS]
    # Beat, last fired just before the skipped day's 01:30, fires the next day's slot.
    message, _ = fire_of(stored.schedule, at("2026-03-28T01:30"), "nightly", now=at("2026-03-30T00:30:01"))
    assert message["nominal_at"] == "2026-03-30T00:30:00+00:00"
    message, _ = fire_of(stored.schedule, at("2026-10-24T01:30"), "nightly", now=at("2026-10-25T01:30:01"))
    assert message["nominal_at"] == "2026-10-25T01:30:00+00:00"


def test_a_schedule_without_dst_keeps_the_default_rule(app: ChordbeatCelery) -> None:
    raw = copy.deepcopy(valid())
    del raw["dst"]
    with transaction(app.settings.database_url) as session:
        upsert_schedule(
            session,
            parse_definition(raw, rules=KNOWN_ONLY),
            source=ScheduleSource.API,
            now=T0,
            origin=VersionOrigin.of(BEAT),
        )
    with transaction(app.settings.database_url, read_only=True) as session:
        schedule = session.scalars(select(Schedule).where(Schedule.name == "nightly")).one()
        cadence = cadence_of(schedule)
    assert schedule.dst is None and cadence.dst is None
    # Today's rule: 01:30 fires at the transition in March and in the first (BST) pass in October.
    assert slots(cadence, SPRING) == [at("2026-03-28T01:30"), at("2026-03-29T01:00"), at("2026-03-30T00:30")]
    assert slots(cadence, AUTUMN) == [at("2026-10-25T00:30"), at("2026-10-26T01:30")]


def test_the_previews_say_what_the_rule_did_on_transition_days(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings
) -> None:
    """chordbeat.next_fires gives each slot's dst note; chordbeat next (and --json) and show print
    them in a terminal 80 columns wide. The previews start at the stored next run, set here to
    the days before each 2026 London change."""
    definition = {**valid(), "dst": {"repeated": "both", "missing": "skip"}}
    call(client, "chordbeat.apply_schedule", definition=definition)

    def from_(first: str) -> None:
        with transaction(app.settings.database_url) as session:
            session.execute(update(Schedule).where(Schedule.name == "nightly").values(next_run_at=at(first)))

    from_("2026-10-24T00:30")
    both = "01:30 happens twice on 2026-10-25; runs in both passes, this is the"
    fires = call(client, "chordbeat.next_fires", name="nightly", count=4)
    assert [(f["local"], f["dst"]) for f in fires] == [
        ("2026-10-24T01:30:00+01:00", None),
        ("2026-10-25T01:30:00+01:00", f"{both} first (dst.repeated: both)"),
        ("2026-10-25T01:30:00+00:00", f"{both} second (dst.repeated: both)"),
        ("2026-10-26T01:30:00+00:00", None),
    ]
    env = processes.settings_env(settings)
    status, output = in_pty([CHORDBEAT, "next", "nightly", "-n", "4"], env, columns=80)
    assert status == 0, output
    lines = [line.rstrip() for line in plain_lines(output)]
    assert all(len(line) <= 80 for line in lines), output
    text = " ".join(" ".join(lines).split())
    assert f"{both} first (dst.repeated: both)" in text and f"{both} second (dst.repeated: both)" in text, output
    status, output = in_pty([CHORDBEAT, "next", "nightly", "-n", "4", "--json"], env, columns=80)
    assert status == 0, output
    assert json.loads(output) == fires
    from_("2026-03-28T01:30")
    fires = call(client, "chordbeat.next_fires", name="nightly", count=2)
    skipped = "01:30 does not happen on 2026-03-29; not run (dst.missing: skip)"
    assert [(f["local"], f["dst"]) for f in fires] == [
        ("2026-03-28T01:30:00+00:00", None),
        ("2026-03-30T01:30:00+01:00", skipped),
    ]
    status, output = in_pty([CHORDBEAT, "show", "nightly"], env, columns=80)
    assert status == 0, output
    lines = [line.rstrip() for line in plain_lines(output)]
    start = lines.index("next runs") + 1
    runs = " ".join(" ".join(lines[start : lines.index("recent executions", start)]).split())
    # Under the slot it concerns.
    assert runs.count("does not happen") == 1, output
    assert runs.index("2026-03-30 01:30:00") < runs.index(skipped) < runs.index("2026-03-31 01:30:00"), output
    assert all(len(line) <= 80 for line in lines), output
