"""The CLI's pieces that need no worker: who it acts as, the viewer's zone, confirmations, wrapping."""

from __future__ import annotations

import pytest

from celeryapp.config import Settings
from celeryapp.errors import ConfigError


def test_the_actor_and_the_viewers_zone_come_from_the_environment() -> None:
    settings = Settings.from_env({"CHORDBEAT_ACTOR": "alice", "TZ": "Asia/Kolkata"})
    assert settings.actor == "alice" and settings.viewer_zone == "Asia/Kolkata"
    assert Settings.from_env({}).actor is None and Settings.from_env({}).viewer_zone is None


@pytest.mark.parametrize("actor", ["a\x1b[2Jb", "x" * 101, "   ", "two\nlines"])
def test_a_bad_actor_is_refused_naming_the_variable(actor: str) -> None:
    with pytest.raises(ConfigError, match="CHORDBEAT_ACTOR: expected a name of 1 to 100 printable characters"):
        Settings.from_env({"CHORDBEAT_ACTOR": actor})
