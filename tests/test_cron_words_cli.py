"""Cron's L, W and # in words where people read them: ``chordbeat show`` and ``chordbeat next``
in an 80-column terminal."""

from __future__ import annotations

import sys
from calendar import monthrange
from datetime import date
from pathlib import Path
from typing import Any

from celeryapp.config import Settings
from tests.support import processes
from tests.support.helpers import call, step
from tests.support.terminals import STYLE, in_pty, plain_lines, wide_lines

CHORDBEAT = str(Path(sys.executable).with_name("chordbeat"))
WORDS = "at 18:00 on the last weekday of the month"


def chordbeat(settings: Settings, *args: str) -> list[str]:
    """The real ``chordbeat`` in an 80-column terminal in India: the lines seen."""
    env = processes.settings_env(settings, TERM="xterm-256color", TZ="Asia/Kolkata")
    status, output = in_pty([CHORDBEAT, *args], env, columns=80)
    assert status == 0, output
    return plain_lines(STYLE.sub("", output))


def test_show_and_next_say_the_expression_in_words(worker: Any, client: Any, settings: Settings) -> None:
    definition = {"name": "month-end", "cron": "0 18 LW * *", "timezone": "Europe/London", "steps": [step("s")]}
    call(client, "chordbeat.apply_schedule", definition=definition)
    shown = chordbeat(settings, "show", "month-end")
    assert not wide_lines(shown), shown
    cron_line = next(i for i, line in enumerate(shown) if "cron 0 18 LW * * Europe/London" in line)
    assert shown[cron_line + 1].strip() == f"{WORDS}, Europe/London time", shown

    upcoming = chordbeat(settings, "next", "month-end", "-n", "3")
    assert not wide_lines(upcoming), upcoming
    assert upcoming[0] == f"{WORDS}, Europe/London time:", upcoming
    for line in upcoming[1:4]:
        day = date.fromisoformat(line[:10])
        last = date(day.year, day.month, monthrange(day.year, day.month)[1])
        while last.isoweekday() > 5:  # back to the last Monday-to-Friday day
            last = date.fromordinal(last.toordinal() - 1)
        assert (day, line[11:19]) == (last, "18:00:00"), upcoming
