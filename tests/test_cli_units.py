"""The CLI's pieces that need no worker: who it acts as, the viewer's zone, confirmations, wrapping."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from celeryapp.config import Settings
from celeryapp.errors import ConfigError
from celeryapp.interfaces.cli.calls import viewer_zone
from celeryapp.interfaces.time_words import here


def test_the_actor_comes_from_the_environment() -> None:
    assert Settings.from_env({"CHORDBEAT_ACTOR": "alice"}).actor == "alice"
    assert Settings.from_env({}).actor is None


@pytest.mark.parametrize(
    ("tz", "summer", "winter"),
    [
        ("Asia/Kolkata", "06:30 IST here", "07:30 IST here"),
        ("Europe/London", "02:00 BST here", ""),  # the same wall time as UTC in winter: nothing beside
        ("IST-5:30", "06:30 IST here", "07:30 IST here"),  # a POSIX rule, as the C library reads it
        ("America/Sao_Paulo", "2026-06-30 22:00 -03:00 here", "2026-11-21 23:00 -03:00 here"),
    ],
)
def test_the_viewers_zone_is_tz_as_date_shows_it_summer_time_included(
    tz: str, summer: str, winter: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TZ", tz)
    time.tzset()
    try:
        viewer = viewer_zone()
        assert here(datetime(2026, 7, 1, 1, tzinfo=UTC), "UTC", viewer) == summer
        assert here(datetime(2026, 11, 22, 2, tzinfo=UTC), "UTC", viewer) == winter
    finally:
        monkeypatch.undo()
        time.tzset()


@pytest.mark.parametrize("actor", ["a\x1b[2Jb", "x" * 101, "   ", "two\nlines"])
def test_a_bad_actor_is_refused_naming_the_variable(actor: str) -> None:
    with pytest.raises(ConfigError, match="CHORDBEAT_ACTOR: expected a name of 1 to 100 printable characters"):
        Settings.from_env({"CHORDBEAT_ACTOR": actor})


def test_long_lines_wrap_at_words_with_a_hanging_indent() -> None:
    from rich.console import Console

    from celeryapp.interfaces.terminal import hanging, text_of

    console = Console(width=40, record=True, color_system=None)
    message = "the bind for svc-hr-sync failed because its password expired yesterday " + "x" * 50
    console.print(hanging(text_of("group 2 LDAP (try 1): "), text_of(message)))
    lines = console.export_text().splitlines()
    assert lines[0] == "group 2 LDAP (try 1): the bind for"
    assert all(line.startswith("    ") and len(line) <= 40 for line in lines[1:]), lines
    assert [w for w in message.split() if len(w) < 40 and w not in " ".join(lines)] == []
    assert "x" * 36 in lines[-2] + lines[-1]  # only a word wider than the line is cut


def test_instants_in_an_audit_reason_read_as_people_times() -> None:
    from zoneinfo import ZoneInfo

    from celeryapp.interfaces.time_words import instants_in as in_zone

    said = in_zone("retry 2 at 2026-11-24T14:33:00.000Z (backoff)", ZoneInfo("Asia/Kolkata"))
    assert said == "retry 2 at 2026-11-24 20:03:00 +05:30 IST (backoff)"
    assert in_zone("no time here", ZoneInfo("UTC")) == "no time here"
