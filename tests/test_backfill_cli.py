"""``chordbeat backfill``, ``backfills`` and ``show``'s time-control lines as a person at an
80-column terminal sees them (in India, a London schedule), against a real worker."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.interfaces.cli import main
from tests.support import processes
from tests.support.helpers import call, step, wait_for
from tests.support.terminals import in_pty, plain_lines, screen_lines, time_format_problems, wide_lines

CHORDBEAT = str(Path(sys.executable).with_name("chordbeat"))
INDIA = {"TZ": "Asia/Kolkata"}
#: London's offset and abbreviation in winter or summer (the slots are relative to today).
LONDON = r"\+0[01]:00 (GMT|BST)"


def _terminal(settings: Settings, *args: str, replies: dict[str, str] | None = None) -> tuple[int, list[str]]:
    """The real ``chordbeat`` in an 80-column pty in India: exit status and the lines shown."""
    env = processes.settings_env(settings, TERM="xterm-256color", **INDIA)
    status, output = in_pty([CHORDBEAT, *args], env, columns=80, timeout=60, replies=replies)
    return status, plain_lines("\n".join(screen_lines(output)))


def _nightly(client: Any, name: str, **fields: Any) -> None:
    definition = {"name": name, "cron": "0 2 * * *", "timezone": "Europe/London", "steps": [step("s")], **fields}
    call(client, "chordbeat.apply_schedule", definition=definition)


def _midnight_utc() -> datetime:
    return datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def _z(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def test_backfill_lists_asks_starts_and_shows_progress_in_80_columns(
    app: ChordbeatCelery, worker: Any, client: Any, settings: Settings
) -> None:
    _nightly(client, "nightly")
    today = _midnight_utc()
    # --from names no offset: the schedule's (London's) midnight of that date, so the first slot
    # is London's 02:00 of that date: 14 slots before today 00:00 UTC.
    first = today - timedelta(days=14)
    span = ["nightly", "--from", f"{first:%Y-%m-%d}", "--to", _z(today)]
    status, lines = _terminal(settings, "backfill", *span, "--dry-run")
    shown = "\n".join(lines)
    assert status == 0, shown
    assert "nightly: 14 slots to backfill (mode missing)" in shown, shown
    assert re.search(rf"first {first:%Y-%m-%d} 02:00:00 {LONDON}, 0[67]:30 IST here, ", shown), shown
    assert "… and 4 more (--json lists them all)" in shown and "dry run: nothing started" in shown, shown
    assert not wide_lines(lines) and not time_format_problems(lines), (wide_lines(lines), time_format_problems(lines))
    assert call(client, "chordbeat.list_backfills", name="nightly") == []
    # Asked, and no: nothing starts.
    question = "start 14 runs of nightly (one at a time, oldest first)? [y/N]"
    status, lines = _terminal(settings, "backfill", *span, replies={"[y/N]": "n\n"})
    assert status == 1 and question in "\n".join(lines) and "nothing changed" in "\n".join(lines), lines
    assert call(client, "chordbeat.list_backfills", name="nightly") == []
    # No terminal to ask in, no --yes: refused at once.
    refused = CliRunner().invoke(main, ["backfill", *span])
    assert refused.exit_code == 1 and "needs confirmation; add --yes" in refused.output, refused.output
    status, lines = _terminal(
        settings, "backfill", *span, "--as", "alice", "--reason", "outage", replies={"[y/N]": "y\n"}
    )
    shown = "\n".join(lines)
    assert status == 0 and "backfill #1 of nightly: 14 slots, oldest first" in shown, shown
    assert "follow it: chordbeat backfills nightly" in shown and "chordbeat backfill --cancel 1" in shown, shown
    assert not wide_lines(lines), wide_lines(lines)
    wait_for(
        lambda: call(client, "chordbeat.get_backfill", backfill_id=1)["status"] == "completed",
        60,
        what="the backfill to complete",
    )
    status, lines = _terminal(settings, "backfills", "nightly")
    shown = "\n".join(lines)
    assert status == 0 and "#1 completed 14/14 started, 14 completed" in shown, shown
    # (Wrapped after the reason's colon when the viewer's stamp carries its date: India past midnight.)
    assert re.search(r"by alice, .* ago: outage", " ".join(shown.split())) and "mode missing, one at a time" in shown, (
        shown
    )
    assert not wide_lines(lines) and not time_format_problems(lines), (wide_lines(lines), time_format_problems(lines))
    # A backfill run says which slot it is for, beside when it started.
    oldest = call(client, "chordbeat.list_executions", schedule="nightly", limit=500)[-1]
    status, lines = _terminal(settings, "execution", str(oldest["id"]))
    shown = "\n".join(lines)
    assert re.search(rf"\(backfill run, took .*\n  for slot {first:%Y-%m-%d} 02:00:00 {LONDON}, 0[67]:30 IST", shown), (
        shown
    )
    assert not wide_lines(lines) and not time_format_problems(lines), (wide_lines(lines), time_format_problems(lines))


def test_refusals_show_the_field_and_why(app: ChordbeatCelery, worker: Any, client: Any) -> None:
    _nightly(client, "nightly")
    today = _midnight_utc()
    span = ["--from", _z(today - timedelta(days=3)), "--to", _z(today)]
    for extra, said, why in (
        (["--max-concurrent", "0"], "max_concurrent: must be a whole number from 1 to 100, got 0", ""),
        (["--max-concurrent", "2"], "max_concurrent: must be 1: schedule 'nightly' has overlap", ""),
    ):
        result = CliRunner().invoke(main, ["backfill", "nightly", *span, *extra, "--yes"])
        assert result.exit_code == 1 and f"Error: {said}" in result.output and why in result.output, result.output
    # The range's refusals name the flags typed, not the service's start/end.
    for extra, said, why in (
        (["--from", _z(today), "--to", _z(today - timedelta(days=1))], "--to: ", "is before --from"),
        (["--to", "2026-02-30T00:00:00Z"], "--to: not a date or time: '2026-02-30T00:00:00Z'", ""),
        (["--to", _z(today + timedelta(days=2))], "--to: ", "is in the future"),
        (["--from", "x" * 10_000], "--from: not a date or time: 'xxxx", "(2026-11-20, 2026-11-20 02:00"),
    ):
        result = CliRunner().invoke(main, ["backfill", "nightly", *span, *extra, "--yes"])
        output = " ".join(result.output.split())  # click wraps its error at 80 columns
        assert result.exit_code == 2 and f"Invalid value for {said}" in output and why in output, result.output
        assert "start:" not in output and "end:" not in output, result.output
        assert len(result.output) < 1000, "the bad text is cut, not echoed whole"
    missing = CliRunner().invoke(main, ["backfill", "nope", *span, "--dry-run"])
    assert missing.exit_code == 1 and "does not exist" in missing.output, missing.output
    assert CliRunner().invoke(main, ["backfill", "nightly"]).exit_code == 2  # no range: a usage error
    assert call(client, "chordbeat.list_backfills", name="nightly") == []
    call(client, "chordbeat.pause_schedule", name="nightly")
    paused = CliRunner().invoke(main, ["backfill", "nightly", *span, "--dry-run"])
    assert "nightly is paused: the runs start when it is resumed" in paused.output, paused.output
    # The worker (in this process) reads its bounds at each call: the schedule's pending slots.
    previous = app.settings
    app.apply_settings(dataclasses.replace(previous, backfill_max_pending_per_schedule=2))
    try:
        bounded = CliRunner().invoke(main, ["backfill", "nightly", *span, "--yes"])
    finally:
        app.apply_settings(previous)
    said = "Invalid value for --to: 3 slots would leave 3 not started in 'nightly''s backfills, more than 2"
    output = " ".join(bounded.output.split())
    assert bounded.exit_code == 2 and said in output, bounded.output
    assert "CHORDBEAT_BACKFILL_MAX_PENDING_PER_SCHEDULE" in output, bounded.output
    assert call(client, "chordbeat.list_backfills", name="nightly") == []


def test_backfill_cancel_asks_first_and_stops_what_has_not_started(
    app: ChordbeatCelery, worker: Any, client: Any, settings: Settings
) -> None:
    _nightly(client, "slow", steps=[step("s", kwargs={"seconds": 30})])
    today = _midnight_utc()
    answer = call(
        client, "chordbeat.backfill_schedule", name="slow", start=_z(today - timedelta(days=5)), end=_z(today)
    )
    backfill_id = answer["backfill_id"]
    status, lines = _terminal(settings, "backfill", "--cancel", str(backfill_id), replies={"[y/N]": "n\n"})
    shown = "\n".join(lines)
    assert status == 1 and f"cancel backfill #{backfill_id} of slow (4 of 5 slots not started)? [y/N]" in shown, shown
    assert call(client, "chordbeat.get_backfill", backfill_id=backfill_id)["status"] == "running"
    status, lines = _terminal(
        settings, "backfill", "--cancel", str(backfill_id), "--reason", "enough", replies={"[y/N]": "y\n"}
    )
    shown = "\n".join(lines)
    assert status == 0 and f"backfill #{backfill_id} of slow: cancelled (1/5 started, 1 running)" in shown, shown
    assert "its runs in progress go on" in shown and not wide_lines(lines), shown
    assert call(client, "chordbeat.get_backfill", backfill_id=backfill_id)["status"] == "cancelled"
    again = CliRunner().invoke(main, ["backfill", "--cancel", str(backfill_id)])
    assert again.exit_code == 0 and "already cancelled; nothing to cancel" in again.output, again.output
    (run,) = call(client, "chordbeat.list_executions", schedule="slow")
    call(client, "chordbeat.cancel_execution", execution_id=run["id"])  # the 30 s step need not be waited out


def test_backfill_wait_follows_it_and_exits_zero_only_when_every_run_completed(
    app: ChordbeatCelery, worker: Any, client: Any, settings: Settings
) -> None:
    _nightly(client, "good", steps=[step("s", kwargs={"seconds": 0.3})])
    _nightly(client, "bad", steps=[step("s", "chordbeat.examples.fail")])
    today = _midnight_utc()
    span = ["--from", _z(today - timedelta(days=3)), "--to", _z(today), "--yes", "--wait"]
    status, lines = _terminal(settings, "backfill", "good", *span)
    shown = "\n".join(lines)
    assert status == 0 and "#1 completed: 3/3 started, 3 completed" in shown, shown
    assert re.search(r"#1 running: [0-3]/3 started", shown) and not wide_lines(lines), shown
    status, lines = _terminal(settings, "backfill", "bad", *span[:-2], "--yes", "--wait")
    assert status == 1 and "#2 completed: 3/3 started, 3 failed" in "\n".join(lines), lines
    as_json = CliRunner().invoke(main, ["backfill", "good", *span[:4], "--mode", "all", "--yes", "--wait", "--json"])
    assert as_json.exit_code == 0, as_json.output
    shown_json = json.loads(as_json.output)  # mode all runs each slot again, whatever ran before
    assert (shown_json["completed"], shown_json["skipped"]) == (3, 0), shown_json


def test_times_without_an_offset_are_the_schedules_and_no_slots_says_why(
    app: ChordbeatCelery, worker: Any, client: Any, settings: Settings
) -> None:
    _nightly(client, "nightly")
    day = (_midnight_utc() - timedelta(days=5)).date()
    after = day + timedelta(days=1)
    # 03:00 to 03:00 London time holds the next day's 02:00 slot (in India's 03:00, 21:30 UTC the
    # day before, it would be this day's).
    status, lines = _terminal(
        settings, "backfill", "nightly", "--from", f"{day} 03:00", "--to", f"{after} 03:00", "--dry-run"
    )
    shown = "\n".join(lines)
    assert status == 0 and "nightly: 1 slot to backfill (mode missing)" in shown, shown
    assert re.search(rf"first {after:%Y-%m-%d} 02:00:00 {LONDON}, ", shown), shown
    status, lines = _terminal(settings, "backfill", "--help")
    assert "no offset: the schedule's zone" in " ".join(" ".join(lines).split()), lines

    # An interval schedule's slots begin when its definition was applied: a range before holds none.
    call(client, "chordbeat.apply_schedule", definition={"name": "hourly", "every": 3600, "steps": [step("s")]})
    status, lines = _terminal(settings, "backfill", "hourly", "--from", f"{day}", "--to", f"{after}", "--dry-run")
    shown = " ".join(" ".join(lines).split())
    assert status == 0 and "hourly: 0 slots to backfill (mode missing)" in shown, shown
    assert f"--from {day:%Y-%m-%d} 00:00:00 +00:00 UTC" in shown and f"--to {after:%Y-%m-%d} 00:00:00" in shown, shown
    assert "why: no slot from " in shown and "an interval schedule's slots begin when its definition" in shown, shown
    assert not wide_lines(lines), wide_lines(lines)

    # Every slot of the range has a run: the mode is why.
    status, lines = _terminal(
        settings, "backfill", "nightly", "--from", f"{day} 03:00", "--to", f"{after} 03:00", "--yes"
    )
    assert status == 0, lines
    wait_for(lambda: call(client, "chordbeat.list_backfills", name="nightly")[0]["status"] == "completed", 30)
    status, lines = _terminal(
        settings, "backfill", "nightly", "--from", f"{day} 03:00", "--to", f"{after} 03:00", "--dry-run"
    )
    shown = " ".join(" ".join(lines).split())
    assert "0 slots" in shown and "already have a run" in shown and "mode all runs them again" in shown, shown
    # The slot record says the backfilled slot came before the schedule existed.
    status, lines = _terminal(settings, "show", "nightly")
    shown = "\n".join(lines)
    assert status == 0 and "before it existed" in shown, shown  # (the schedule, in its slot table)
    (slot,) = [s for s in call(client, "chordbeat.list_slots", name="nightly") if s["trigger"] == "backfill"]
    assert slot["before_schedule"] is True, slot
