"""A definition's ``calendar``: every mistake at once naming the field, named calendars checked
against the files of ``CHORDBEAT_CALENDARS_DIR`` at apply (a missing or broken file refuses the
definition, loudly), and the field kept through apply, get, the schedule file and ``definition_of``."""

from __future__ import annotations

import copy
import dataclasses
import logging
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from celery import Celery
from sqlalchemy import select

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.domain.definition import CalendarRules, OnExcluded
from celeryapp.domain.step_policy import StepRules
from celeryapp.domain.validation import parse_definition
from celeryapp.errors import DefinitionError
from celeryapp.scheduling.beat import ChordbeatScheduler
from celeryapp.scheduling.calendar_files import (
    calendar_reader,
    excluded_slots,
    read_calendar,
    unreadable_calendars,
)
from celeryapp.scheduling.schedule_file import apply_file, load_file
from models import Schedule, transaction
from models.definitions import definition_of
from tests.support.helpers import call, set_field, step

KNOWN_ONLY = StepRules.without_policy({"chordbeat.examples.sleep"}.__contains__)
UK = "# England and Wales\n2026-12-25  # Christmas\n2026-12-28\n"


def valid() -> dict[str, Any]:
    return {
        "name": "payroll",
        "cron": "0 18 * * 1-5",
        "timezone": "Europe/London",
        "steps": [step("pay")],
        "calendar": {"exclude": ["2026-12-24"], "calendars": ["uk-bank-holidays"], "on_excluded": "skip"},
    }


def with_change(path: str, value: Any) -> dict[str, Any]:
    return set_field(copy.deepcopy(valid()), path, value)


@pytest.fixture
def calendars_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "calendars"
    directory.mkdir()
    (directory / "uk-bank-holidays").write_text(UK)
    return directory


def errors_of(definition: Any, directory: Path | None) -> dict[str, str]:
    with pytest.raises(DefinitionError) as caught:
        parse_definition(definition, rules=KNOWN_ONLY, calendars=calendar_reader(str(directory) if directory else None))
    return {e.field: e.reason for e in caught.value.errors}


def test_the_field_reads_back_as_written(calendars_dir: Path) -> None:
    parsed = parse_definition(valid(), rules=KNOWN_ONLY, calendars=calendar_reader(str(calendars_dir)))
    assert parsed.calendar == CalendarRules((date(2026, 12, 24),), ("uk-bank-holidays",), OnExcluded.SKIP)
    assert parsed.to_json()["calendar"] == valid()["calendar"]
    assert CalendarRules.from_json(parsed.to_json()["calendar"]) == parsed.calendar
    # on_excluded defaults to skip; a calendar of inline dates only needs no directory.
    alone = parse_definition(with_change("calendar", {"exclude": ["2026-12-25"]}), rules=KNOWN_ONLY)
    assert alone.calendar == CalendarRules((date(2026, 12, 25),), (), OnExcluded.SKIP)
    assert parse_definition(with_change("calendar", None), rules=KNOWN_ONLY).calendar is None
    # YAML reads an unquoted date as a date.
    assert parse_definition(with_change("calendar/exclude", [date(2026, 12, 24)]), rules=KNOWN_ONLY).calendar


@pytest.mark.parametrize(
    ("path", "value", "field", "reason"),
    [
        ("calendar", [], "calendar", "must be an object, got list"),
        ("calendar", {}, "calendar", "must give exclude dates or calendars"),
        ("calendar/when", 1, "calendar.when", "unknown field"),
        ("calendar/exclude", "2026-12-25", "calendar.exclude", "must be a list of dates, got str"),
        ("calendar/exclude", ["2026-02-30"], "calendar.exclude[0]", "2026-02-30 is not a date that exists"),
        ("calendar/exclude", ["25/12/2026"], "calendar.exclude[0]", "is not a date written YYYY-MM-DD"),
        ("calendar/exclude", [20261225], "calendar.exclude[0]", "must be a date written YYYY-MM-DD, got int"),
        ("calendar/exclude", ["2026-12-25", "2026-12-25"], "calendar.exclude[1]", "is listed twice"),
        ("calendar/exclude", ["2026-01-01"] * 1001, "calendar.exclude", "at most 1000 dates, got 1001"),
        ("calendar/calendars", ["../etc/passwd"], "calendar.calendars[0]", "is not a calendar name"),
        ("calendar/calendars", ["/etc/passwd"], "calendar.calendars[0]", "is not a calendar name"),
        ("calendar/calendars", [".hidden"], "calendar.calendars[0]", "is not a calendar name"),
        ("calendar/calendars", [None], "calendar.calendars[0]", "must be a calendar name, got NoneType"),
        ("calendar/calendars", ["a", "a"], "calendar.calendars[1]", "'a' is named twice"),
        ("calendar/calendars", [f"c{n}" for n in range(21)], "calendar.calendars", "at most 20 calendar names"),
        ("calendar/on_excluded", "never", "calendar.on_excluded", "must be one of skip, next_business_day"),
        ("calendar/on_excluded", True, "calendar.on_excluded", "must be one of skip, next_business_day, got bool"),
    ],
)
def test_each_mistake_is_refused_naming_the_field(path: str, value: Any, field: str, reason: str) -> None:
    errors = errors_of(with_change(path, value), None)
    assert field in errors and reason in errors[field], errors


def test_next_business_day_is_for_cron_schedules_only() -> None:
    moving = with_change("calendar", {"exclude": ["2026-12-24"], "on_excluded": "next_business_day"})
    assert parse_definition(moving, rules=KNOWN_ONLY).calendar == CalendarRules(
        (date(2026, 12, 24),), (), OnExcluded.NEXT_BUSINESS_DAY
    )
    interval = {**moving, "every": 3600}
    del interval["cron"]
    assert errors_of(interval, None) == {
        "calendar.on_excluded": "'next_business_day' is for cron schedules only: an 'every' schedule's slots have no"
        " wall time to keep"
    }
    # Neither cron nor every: that is the mistake, not the rule.
    del interval["every"]
    assert "calendar.on_excluded" not in errors_of(interval, None)


def test_a_named_calendar_must_be_a_readable_file(calendars_dir: Path) -> None:
    missing = with_change("calendar/calendars", ["uk-bank-holidays", "nyse"])
    assert errors_of(missing, calendars_dir) == {
        "calendar.calendars[1]": f"calendar 'nyse' cannot be used: no file nyse in CHORDBEAT_CALENDARS_DIR "
        f"({calendars_dir})"
    }
    (calendars_dir / "broken").write_text("2026-12-25\n2026-02-30\n")
    broken = errors_of(with_change("calendar/calendars", ["broken"]), calendars_dir)
    assert broken["calendar.calendars[0]"].endswith(
        "broken: line 2 is not a date that exists (day is out of range for month)"
    )
    (calendars_dir / "huge").write_text("\n" * 1_000_000)
    assert (
        "has more than 100000 lines"
        in errors_of(with_change("calendar/calendars", ["huge"]), calendars_dir)["calendar.calendars[0]"]
    )
    (calendars_dir / "binary").write_bytes(b"2026-12-25\n\xff\n")
    assert (
        "is not UTF-8 text"
        in errors_of(with_change("calendar/calendars", ["binary"]), calendars_dir)["calendar.calendars[0]"]
    )
    (calendars_dir / "directory").mkdir()
    assert (
        "cannot be read"
        in errors_of(with_change("calendar/calendars", ["directory"]), calendars_dir)["calendar.calendars[0]"]
    )
    unset = errors_of(valid(), None)["calendar.calendars[0]"]
    assert "CHORDBEAT_CALENDARS_DIR is not set" in unset


def test_a_calendar_file_is_read_again_when_it_changes(calendars_dir: Path) -> None:
    path = calendars_dir / "uk-bank-holidays"
    assert read_calendar(str(calendars_dir), "uk-bank-holidays") == {date(2026, 12, 25), date(2026, 12, 28)}
    path.write_text(UK + "2027-01-01\n")
    assert date(2027, 1, 1) in read_calendar(str(calendars_dir), "uk-bank-holidays")


# --- stored: through the service task, the schedule file and beat's start ----------------------


@pytest.fixture
def settings(settings: Settings, calendars_dir: Path) -> Settings:
    return dataclasses.replace(settings, calendars_dir=str(calendars_dir))


def stored(app: ChordbeatCelery, name: str) -> tuple[Any, CalendarRules | None]:
    with transaction(app.settings.database_url) as session:
        schedule = session.scalars(select(Schedule).where(Schedule.name == name)).one()
        return schedule.calendar, definition_of(schedule).calendar


def test_apply_and_get_give_the_calendar_back_and_a_missing_file_stores_nothing(
    app: ChordbeatCelery, worker: Any, client: Celery, calendars_dir: Path
) -> None:
    created = call(client, "chordbeat.apply_schedule", definition=valid())
    assert created["calendar"] == valid()["calendar"]
    assert call(client, "chordbeat.get_schedule", name="payroll")["calendar"] == created["calendar"]
    assert stored(app, "payroll") == (created["calendar"], CalendarRules.from_json(created["calendar"]))
    assert call(client, "chordbeat.apply_schedule", definition=valid()) == created
    with pytest.raises(Exception, match=r"calendar\.calendars\[0\]: calendar 'nyse' cannot be used: no file nyse"):
        call(client, "chordbeat.apply_schedule", definition=with_change("calendar/calendars", ["nyse"]))
    assert stored(app, "payroll")[0] == created["calendar"]
    bare = call(client, "chordbeat.apply_schedule", definition={**valid(), "calendar": None})
    assert bare["calendar"] is None and stored(app, "payroll") == (None, None)


def test_the_schedule_file_checks_the_calendars_and_beat_says_an_unreadable_one_at_start(
    app: ChordbeatCelery, tmp_path: Path, calendars_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "pay.yaml"
    path.write_text(yaml.safe_dump({"schedules": [valid()]}))
    assert apply_file(app, path).added == ["payroll"]
    assert apply_file(app, path).summary() == "no changes"
    (hr,) = load_file(path, rules=None)
    assert hr.calendar is not None and hr.calendar.calendars == ("uk-bank-holidays",)
    path.write_text(yaml.safe_dump({"schedules": [with_change("calendar/calendars", ["nyse"])]}))
    with pytest.raises(DefinitionError, match=r"schedules\[0\] \(payroll\)\.calendar\.calendars\[0\]: calendar 'nyse'"):
        apply_file(app, path)
    assert unreadable_calendars(app.settings.database_url, app.settings.calendars_dir) == []
    # The file goes after the schedule was applied: beat says so at start, as an error.
    (calendars_dir / "uk-bank-holidays").unlink()
    problems = unreadable_calendars(app.settings.database_url, app.settings.calendars_dir)
    assert problems == [
        f"schedule 'payroll': calendar 'uk-bank-holidays' cannot be used: no file uk-bank-holidays in "
        f"CHORDBEAT_CALENDARS_DIR ({calendars_dir})"
    ]
    scheduler = ChordbeatScheduler.__new__(ChordbeatScheduler)
    scheduler.app = app
    with caplog.at_level(logging.ERROR, logger="celeryapp.scheduling.beat"):
        scheduler._say_unreadable_calendars()
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR] == [
        f"beat: {problems[0]}; its slots start nothing until the calendar can be read"
    ]


#: A file of the calendars directory that is not a calendar (issue 36): its lines must never be
#: echoed back by a refusal, whoever asks.
SECRET_LINE = "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


def test_a_file_that_is_not_a_calendar_is_refused_without_showing_its_lines(
    app: ChordbeatCelery, worker: Any, client: Celery, tmp_path: Path, calendars_dir: Path
) -> None:
    (calendars_dir / "deploy.env").write_text(f"# deploy settings\n{SECRET_LINE}\n")
    (calendars_dir / "dates.env").write_text("2026-12-25\n2026-99-01\n")
    definition = with_change("calendar/calendars", ["deploy.env", "dates.env"])
    # The service's reply (what the CLI and the dashboard's forms show).
    with pytest.raises(Exception) as caught:
        call(client, "chordbeat.apply_schedule", definition=definition)
    reply = str(caught.value)
    assert "calendar.calendars[0]: calendar 'deploy.env' cannot be used:" in reply
    assert "deploy.env: line 2 is not a date written YYYY-MM-DD" in reply
    assert "calendar.calendars[1]: calendar 'dates.env' cannot be used:" in reply
    # A schedule file (chordbeat apply), and the reason shown for every slot of a stored schedule
    # whose calendar became such a file (the dashboard's schedule page and the fire preview).
    path = tmp_path / "pay.yaml"
    path.write_text(yaml.safe_dump({"schedules": [definition]}))
    with pytest.raises(DefinitionError) as from_file:
        apply_file(app, path)
    stored_calendar = {"calendars": ["deploy.env"], "on_excluded": "skip"}
    (shown,) = excluded_slots(app.settings.calendars_dir, stored_calendar, "UTC", [datetime.now(UTC)])
    assert shown is not None and "deploy.env: line 2 is not a date" in shown
    for text in (reply, str(from_file.value), shown):
        for secret in (SECRET_LINE, "wJalrXUtnFEMI", "2026-99-01"):
            assert secret not in text, text
