"""The ``chordbeat`` command against a real worker, through the service tasks."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import text

import tests.support.cli_tasks  # noqa: F401  (registers the CLI tests' step tasks in the in-process worker)
from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.interfaces import listing
from celeryapp.interfaces.cli import main
from celeryapp.monitoring.health import touch
from models import transaction
from tests.support import processes
from tests.support.helpers import call, finished, step, wait_for
from tests.support.terminals import RELATIVE, WALL_TIME, in_pty, plain_lines, time_format_problems, wide_lines

CHORDBEAT = str(Path(sys.executable).with_name("chordbeat"))
#: Markup, an SGR colour, a screen clear, an OSC 8 hyperlink, a carriage return and a bidi override.
HOSTILE = "[/] [link=http://x]x[/link] \x1b[31mred \x1b[2J \x1b]8;;http://evil\x1b\\e\x1b]8;;\x1b\\ a\rb \u202eevil"
#: What the terminal must show of it instead: the text, with every control as a visible escape.
SHOWN = ("[/]", "[link=http://x]x[/link]", "\\x1b[31mred", "\\x1b[2J", "\\x1b]8;;http://evil", "a\\rb", "\\u202eevil")
#: Rich's own styling (SGR) in a colour terminal; anything else that steers the terminal came from data.
RICH_STYLE = re.compile(r"\x1b\[[0-9;]*m")
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def in_terminal(
    settings: Settings,
    *args: str,
    columns: int = 80,
    timeout: float = 60,
    interrupt_on: str | None = None,
    env: dict[str, str] | None = None,
    replies: dict[str, str] | None = None,
) -> tuple[int, str]:
    """Run the real ``chordbeat`` in a pseudo-terminal ``columns`` wide: exit status and output.

    With ``interrupt_on``, the program gets a SIGINT (Ctrl-C) once its output shows that text;
    ``replies`` are typed once their question (the key) shows; ``env`` adds variables.
    """
    env = processes.settings_env(settings, TERM="xterm-256color", **(env or {}))
    return in_pty([CHORDBEAT, *args], env, columns=columns, timeout=timeout, interrupt_on=interrupt_on, replies=replies)


def test_run_wait_exits_zero_only_for_a_completed_run(app: ChordbeatCelery, worker: Any, client: Any) -> None:
    call(client, "chordbeat.apply_schedule", definition={"name": "good", "every": 60, "steps": [step("a"), step("b")]})
    call(
        client,
        "chordbeat.apply_schedule",
        definition={"name": "bad", "every": 60, "steps": [step("a", "chordbeat.examples.fail")]},
    )
    ok = cli("run", "good", "--wait", "--payload", '{"who": "cli"}')
    assert ok.exit_code == 0, ok.output
    assert "execution 1 of good: completed" in ok.output
    failed = cli("run", "bad", "--wait")
    assert failed.exit_code == 1
    assert "step 'a' failed: StepFailed: a says so" in failed.output
    as_json = cli("run", "good", "--wait", "--json")
    assert as_json.exit_code == 0 and json.loads(as_json.output)["payload"] == {}
    assert cli("run", "good", "--payload", "{nope").exit_code == 2
    assert "does not exist" in cli("run", "missing").output


def test_read_commands_offer_json(app: ChordbeatCelery, worker: Any, client: Any) -> None:
    call(
        client,
        "chordbeat.apply_schedule",
        definition={"name": "ny", "cron": "0 2 * * *", "timezone": "Asia/Tokyo", "steps": [step("s")]},
    )
    listed = json.loads(cli("list", "--json").output)
    assert [s["name"] for s in listed] == ["ny"]
    upcoming = json.loads(cli("next", "ny", "-n", "3", "--json").output)
    assert len(upcoming) == 3 and all(t["local"].endswith("T02:00:00+09:00") for t in upcoming), upcoming
    assert all(t["at"].endswith("T17:00:00.000Z") and t["excluded"] is None for t in upcoming), upcoming
    assert re.search(r"02:00:00 \+09:00 JST, 2026-\d\d-\d\d 17:00 UTC here, in ", cli("next", "ny", "-n", "2").output)
    cli("run", "ny", "--wait")
    shown = json.loads(cli("show", "ny", "--json").output)
    assert shown["schedule"]["run_count"] == 1 and len(shown["executions"]) == 1
    assert shown["slots"][0]["outcome"] == "fired" and shown["slots"][0]["trigger"] == "manual"
    assert "recent executions" in cli("show", "ny").output
    executions = json.loads(cli("executions", "--schedule", "ny", "--json").output)
    assert executions[0]["status"] == "completed"
    assert json.loads(cli("pause", "ny", "--yes", "--json").output)["status"] == "paused"
    assert "ny: active" in cli("resume", "ny").output


def test_cancel_from_the_cli(app: ChordbeatCelery, worker: Any, client: Any) -> None:
    call(
        client,
        "chordbeat.apply_schedule",
        definition={"name": "slow", "every": 60, "steps": [step("s", kwargs={"seconds": 30})]},
    )
    execution_id = call(client, "chordbeat.trigger_schedule", name="slow")["execution_id"]
    assert f"execution {execution_id}: cancelled" in cli("cancel", str(execution_id), "--yes").output


def test_health_reports_stale_and_fresh_liveness_files(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("CHORDBEAT_HEALTH_DIR", str(tmp_path))
    assert cli("health", "worker").exit_code == 1
    touch(Settings(health_dir=str(tmp_path)), "worker")
    healthy = cli("health", "worker")
    assert healthy.exit_code == 0 and "worker: healthy" in healthy.output
    path = tmp_path / "chordbeat-worker.health"
    os.utime(path, (0, 0))
    assert "unhealthy" in cli("health", "worker").output


def test_beat_counts_as_stalled_after_the_stall_setting(tmp_path: Any, monkeypatch: Any) -> None:
    """The probe and beat's watchdog share one limit: a beat the probe calls stalled has ended itself."""
    monkeypatch.setenv("CHORDBEAT_HEALTH_DIR", str(tmp_path))
    touch(Settings(health_dir=str(tmp_path)), "beat")
    path = tmp_path / "chordbeat-beat.health"
    now = time.time()
    os.utime(path, (now - 100, now - 100))
    assert cli("health", "beat").exit_code == 0  # default limit: 120 s
    monkeypatch.setenv("CHORDBEAT_BEAT_STALL", "90")
    assert "beat: unhealthy (last beat 100s ago)" in cli("health", "beat").output


def test_the_live_view_shows_each_step_once_with_its_current_attempt() -> None:
    from celeryapp.interfaces.display import step_states

    execution = {
        "activities": [
            {"step_index": 0, "step": "a", "status": "complete", "attempt": 1},
            {"step_index": 1, "step": "b", "status": "failed_with_error", "attempt": 1},
            {"step_index": 1, "step": "c", "status": "in_progress", "attempt": 1},
        ],
        "tasks": [
            {"step_index": 1, "step": "b", "status": "queued", "attempt": 2},
            {"step_index": 1, "step": "c", "status": "processing", "attempt": 1},
            {"step_index": 2, "step": "d", "status": "waiting_for_previous_step", "attempt": 1},
        ],
    }
    assert step_states(execution) == {
        (0, "a"): ("complete", 1),
        (1, "b"): ("queued", 2),
        (1, "c"): ("in_progress", 1),
        (2, "d"): ("waiting_for_previous_step", 1),
    }


@pytest.fixture
def hostile(app: ChordbeatCelery, worker: Any, client: Any) -> int:
    """A schedule whose step name and error carry markup and terminal controls; one failed run.

    Definitions refuse control characters in step names now, but a name stored before that rule (or
    written by hand into the database) must still print as text: it goes in through SQL.
    """
    bad_step = step("s", "chordbeat.examples.fail", kwargs={"message": HOSTILE})
    call(client, "chordbeat.apply_schedule", definition={"name": "hostile", "every": 3600, "steps": [bad_step]})
    with transaction(app.settings.database_url) as session:
        session.execute(text("UPDATE schedule_steps SET name = :name"), {"name": f"s {HOSTILE}"})
    execution_id: int = call(client, "chordbeat.trigger_schedule", name="hostile")["execution_id"]
    assert finished(client, execution_id)["status"] == "failed"
    return execution_id


@pytest.mark.parametrize("command", [("show", "hostile"), ("executions", "--schedule", "hostile")])
def test_the_cli_prints_names_and_errors_as_text_never_as_markup_or_terminal_controls(
    hostile: int, settings: Settings, command: tuple[str, ...]
) -> None:
    status, output = in_terminal(settings, *command)
    assert status == 0, output
    assert "Traceback" not in output and "Error" not in output, output
    assert "\x1b]8;" not in output, "a hyperlink reached the terminal"
    text = RICH_STYLE.sub("", output)
    assert not CONTROL.findall(text), CONTROL.findall(text)
    if command[0] == "show":
        for shown in SHOWN:
            assert shown in text, (shown, text)


def test_the_live_view_shows_hostile_step_names_as_text(hostile: int, settings: Settings) -> None:
    status, output = in_terminal(settings, "run", "hostile", "--wait")
    assert status == 1, output
    assert "Traceback" not in output and "\x1b]8;" not in output, output
    assert "\\x1b[2J" in output and "\x1b[2J" not in output, output


def test_with_no_worker_a_command_fails_in_seconds_saying_what_to_start(app: ChordbeatCelery) -> None:
    started = time.monotonic()
    result = CliRunner().invoke(main, ["list"])
    elapsed = time.monotonic() - started
    assert result.exit_code == 1, result.output
    assert "no chordbeat worker is consuming the 'celery' queue" in result.output
    assert "celery -A celeryapp worker" in result.output
    assert elapsed < 10, f"took {elapsed:.1f}s"


def test_a_call_nobody_answered_expires_instead_of_acting_when_a_worker_appears(
    app: ChordbeatCelery, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    from celery.exceptions import TimeoutError as CeleryTimeout

    from celeryapp.client import ChordbeatClient
    from celeryapp.scheduling.schedule_file import apply_file

    path = tmp_path / "s.yaml"
    path.write_text(json.dumps({"schedules": [{"name": "late", "every": 3600, "steps": [step("s")]}]}))
    apply_file(app, path)
    caller = ChordbeatClient(app.settings.broker_url, app.settings.result_backend, timeout_s=1)
    try:
        with pytest.raises(CeleryTimeout):
            caller.trigger_schedule("late")
        time.sleep(1.5)  # past the message's expiry: what is being tested, not synchronisation
        request.getfixturevalue("worker")
        caller.timeout_s = 20
        # The worker answers remote control once its consumer is up, a moment after it started.
        wait_for(caller.worker_listening, 30, what="the worker to answer remote control")
        assert [s["name"] for s in caller.list_schedules()] == ["late"]  # queued behind the expired call
        assert caller.list_executions(schedule="late") == []
        assert caller.get_schedule("late")["run_count"] == 0
    finally:
        caller.close()


def test_health_says_unhealthy_once_a_worker_stopped_cleanly(
    app: ChordbeatCelery, settings: Settings, tmp_path: Path
) -> None:
    def health() -> tuple[int, str]:
        done = subprocess.run(
            [CHORDBEAT, "health", "worker"], env=processes.settings_env(settings), capture_output=True, text=True
        )
        return done.returncode, done.stdout

    process = processes.start_worker(settings, tmp_path)
    try:
        wait_for(lambda: health()[0] == 0, 60, what="the worker's liveness file")
    finally:
        process.stop()
    assert process.proc.returncode is not None
    status, output = health()
    assert status == 1 and "worker: unhealthy (no liveness file" in output, output


def test_time_format_problems_are_found() -> None:
    assert not time_format_problems(["2026-11-22 02:00:00 +00:00 GMT, 07:30 IST here, 10 h ago"])
    assert not time_format_problems(["  1  2026-11-22 02:00:00   x", "     +00:00 GMT, in 5 s"])
    assert time_format_problems(["2026-11-22T02:00:00.000Z"])
    assert time_format_problems(["finished 2026-11-22 02:00:00, 3 min ago"])
    assert time_format_problems(["to 02:00:05"])
    assert time_format_problems(["07:30 IST"])
    assert not time_format_problems([" 2026-11-25 02:08   x", " IST here       y"])
    assert time_format_problems([" 2026-11-25 02:08   x", " 1 s ago        y"])
    assert not time_format_problems(["  at 02:00 every day, Europe/London time"])
    assert time_format_problems(["  at 02:00 every day"])


@pytest.fixture
def views(app: ChordbeatCelery, worker: Any, client: Any, settings: Settings) -> dict[str, Any]:
    """A London schedule with a failed run (a warned step before it), an interval schedule with a
    run that completed with a warning: ids of both runs."""
    slow_steps = [
        step("HR System - Full Import"),
        [step("AD - Export"), step("LDAP - Export", "chordbeat.examples.fail", kwargs={"message": "LDAP said no"})],
        step("Confirm", "chordbeat.examples.warn", kwargs={"message": "3 records skipped"}),
    ]
    definition = {"name": "nightly-hr-sync", "cron": "0 2 * * *", "timezone": "Europe/London", "steps": slow_steps}
    call(client, "chordbeat.apply_schedule", definition=definition)
    warned = [step("a"), step("w", "chordbeat.examples.warn", kwargs={"message": "3 records skipped"})]
    call(client, "chordbeat.apply_schedule", definition={"name": "every-minute", "every": 60, "steps": warned})
    failed = finished(client, call(client, "chordbeat.trigger_schedule", name="nightly-hr-sync")["execution_id"])
    ok = finished(client, call(client, "chordbeat.trigger_schedule", name="every-minute")["execution_id"])
    return {"failed": failed["id"], "warned": ok["id"]}


def test_every_view_fits_80_columns_with_one_time_format_and_no_microseconds(
    views: dict[str, Any], settings: Settings
) -> None:
    shown = {}
    for command in (
        ("list",),
        ("show", "nightly-hr-sync"),
        ("executions",),
        ("executions", "--schedule", "nightly-hr-sync"),
        ("execution", str(views["failed"])),
        ("execution", str(views["warned"])),
        ("next", "nightly-hr-sync", "-n", "3"),
    ):
        status, output = in_terminal(settings, *command, env={"TZ": "Asia/Kolkata"})
        assert status == 0, output
        lines = plain_lines(RICH_STYLE.sub("", output))
        assert not wide_lines(lines), "\n".join(lines)
        text = "\n".join(lines)
        assert WALL_TIME.search(text) and RELATIVE.search(text), text
        assert not time_format_problems(lines), (time_format_problems(lines), text)
        assert "WARNING" not in text, text
        shown[" ".join(command[:2])] = text
    # The viewer (TZ) sees their own time beside London's; a list of several schedules is all in theirs.
    assert re.search(r"02:00:00 \+0[01]:00 (GMT|BST), 0[67]:30 IST here, in ", shown["next nightly-hr-sync"])
    assert "IST here" in shown["show nightly-hr-sync"] and "IST here" in shown[f"execution {views['failed']}"]
    assert "(IST)" in shown["executions"] and "+05:30 IST" in shown["executions"]
    assert "+00:00 GMT" not in shown["executions"], "a list of several schedules mixed zones"
    assert "next run (IST)" in shown["list"]
    failed_view = shown[f"execution {views['failed']}"]
    assert re.search(r"^\s*1\s+HR System - Full Import\s+completed", failed_view, re.M), failed_view
    assert re.search(r"^\s*2\s+LDAP - Export\s+failed ", failed_view, re.M), failed_view
    assert "LDAP - Export (try 1): StepFailed: LDAP said no" in failed_view
    assert "took 0." in failed_view and "finished 20" in failed_view
    assert "warning: 3 records skipped" in shown[f"execution {views['warned']}"]
    assert "LDAP said no" in shown["executions"]
    # One failed run is one run, not "runs 0, failed 1".
    assert "runs 1 (1 failed) · successful 0" in shown["show nightly-hr-sync"], shown["show nightly-hr-sync"]
    assert re.search(r"nightly-hr-sync\s.*\sactive\s", shown["list"]), shown["list"]
    for text in shown.values():  # people's words, not stored names
        assert not re.search(r"failed_with_error|complete_with|waiting_for|in_progress|skipped_", text), text
    assert "\x1b[" in in_terminal(settings, "executions")[1], "states are coloured in a terminal"


def test_a_run_with_a_warned_step_reads_completed_with_warnings(views: dict[str, Any], settings: Settings) -> None:
    for command in (("executions",), ("execution", str(views["warned"])), ("show", "every-minute")):
        text = "\n".join(plain_lines(RICH_STYLE.sub("", in_terminal(settings, *command)[1])))
        assert re.search(r"completed\s+with\s+warnings", text), text
    one = "\n".join(plain_lines(RICH_STYLE.sub("", in_terminal(settings, "execution", str(views["warned"]))[1])))
    assert f"execution {views['warned']} of every-minute: completed with warnings" in one, one


def test_ctrl_c_on_run_wait_says_the_run_goes_on_and_how_to_cancel_it(
    app: ChordbeatCelery, worker: Any, client: Any, settings: Settings
) -> None:
    definition = {"name": "slow", "every": 3600, "steps": [step("s", kwargs={"seconds": 30})]}
    call(client, "chordbeat.apply_schedule", definition=definition)
    status, output = in_terminal(settings, "run", "slow", "--wait", interrupt_on="group 1")
    assert status == 130, output
    text = "\n".join(plain_lines(RICH_STYLE.sub("", output)))
    assert "stopped watching; execution 1 goes on" in text, text
    assert "chordbeat execution 1 --watch" in text and "chordbeat cancel 1" in text
    assert "Traceback" not in text and "Aborted" not in text
    assert call(client, "chordbeat.get_execution", execution_id=1)["status"] == "in_progress"
    call(client, "chordbeat.cancel_execution", execution_id=1)
    status, output = in_terminal(settings, "execution", "1", "--watch")
    assert status == 1 and "execution 1 of slow: cancelled" in RICH_STYLE.sub("", output), output


def test_list_follows_the_cursor_and_executions_say_how_to_see_the_older_page(
    app: ChordbeatCelery, worker: Any, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Since lists come in pages (issue 23), ``list`` showed only the first 500 schedules."""
    definition = {"name": "s000", "every": 3600, "timezone": "Asia/Tokyo", "overlap": "allow", "steps": [step("x")]}
    call(client, "chordbeat.apply_schedule", definition=definition)
    copy_schedule(app, "s000", [f"s{i:03}" for i in range(1, 501)])
    listed = json.loads(cli("list", "--json").output)
    assert [s["name"] for s in listed] == [f"s{i:03}" for i in range(501)]

    ids = [call(client, "chordbeat.trigger_schedule", name="s000")["execution_id"] for _ in range(3)]
    first = cli("executions", "--schedule", "s000", "--limit", "2")
    assert f"more: chordbeat executions --schedule s000 --limit 2 --before {ids[1]}" in first.output
    older = cli("executions", "--schedule", "s000", "--limit", "2", "--before", str(ids[1]), "--json")
    assert [e["id"] for e in json.loads(older.output)] == [ids[0]]
    assert "more:" not in cli("executions", "--limit", "2", "--before", str(ids[1])).output
    # Times in the schedule's zone, its zone asked for by name or, for many names, read page by page.
    assert "+09:00 JST" in cli("executions").output
    monkeypatch.setattr(listing, "ZONE_LOOKUPS", 0)
    assert "+09:00 JST" in cli("executions").output
    for execution_id in ids:
        finished(client, execution_id)
    call(client, "chordbeat.delete_schedule", name="s000")
    # Its runs are kept: shown in UTC now that the schedule (and its zone) is gone.
    shown = cli("execution", str(ids[0]))
    assert shown.exit_code == 0 and "+00:00 UTC" in shown.output, shown.output


def copy_schedule(app: ChordbeatCelery, name: str, names: list[str]) -> None:
    """Copies of a stored schedule (and its steps) under other names, written in SQL (fast)."""
    with transaction(app.settings.database_url) as session:
        source = session.execute(text("SELECT id FROM schedules WHERE name = :n"), {"n": name}).scalar_one()
        for other in names:
            copied = session.execute(
                text(_copy_sql(session, "schedules", "id", {"name": ":name"}) + " RETURNING id"),
                {"name": other, "id": source},
            ).scalar_one()
            session.execute(
                text(_copy_sql(session, "schedule_steps", "schedule_id", {"schedule_id": ":to"})),
                {"to": copied, "id": source},
            )


def _copy_sql(session: Any, table: str, key: str, replaced: dict[str, str]) -> str:
    """INSERT … SELECT of the rows whose ``key`` is ``:id``, some columns replaced by parameters."""
    columns = [c for c in session.execute(text(f"SELECT * FROM {table} LIMIT 0")).keys() if c != "id"]  # noqa: SIM118
    picked = ", ".join(replaced.get(c, c) for c in columns)
    return f"INSERT INTO {table} ({', '.join(columns)}) SELECT {picked} FROM {table} WHERE {key} = :id"


def test_cancel_asks_first_and_no_changes_nothing(
    app: ChordbeatCelery, worker: Any, client: Any, settings: Settings
) -> None:
    definition = {"name": "payroll-export", "every": 3600, "steps": [step("s", kwargs={"seconds": 30})]}
    call(client, "chordbeat.apply_schedule", definition=definition)
    execution_id = call(client, "chordbeat.trigger_schedule", name="payroll-export")["execution_id"]
    question = f"cancel execution {execution_id} of payroll-export (running "
    status, output = in_terminal(settings, "cancel", str(execution_id), replies={"[y/N]": "n\n"})
    assert status == 1 and question in output and "nothing changed" in output, output
    assert call(client, "chordbeat.get_execution", execution_id=execution_id)["status"] == "in_progress"
    # No terminal to ask in and no --yes: refused at once, not left waiting.
    refused = CliRunner().invoke(main, ["cancel", str(execution_id)])
    assert refused.exit_code == 1 and "needs confirmation; add --yes" in refused.output, refused.output
    assert call(client, "chordbeat.get_execution", execution_id=execution_id)["status"] == "in_progress"
    status, output = in_terminal(
        settings, "cancel", str(execution_id), "--as", "alice", "--reason", "wrong payload", replies={"[y/N]": "y\n"}
    )
    assert status == 0 and f"execution {execution_id}: cancelled" in RICH_STYLE.sub("", output), output
    cancelled = call(client, "chordbeat.get_execution", execution_id=execution_id)
    assert cancelled["status"] == "cancelled" and cancelled["error"] == "cancelled by alice (service): wrong payload"
    again = cli("cancel", str(execution_id))  # nothing to ask about
    assert again.exit_code == 0 and "already cancelled; nothing to cancel" in again.output, again.output


def test_pause_asks_and_shows_who_paused_it_since_when_and_why(
    app: ChordbeatCelery, worker: Any, client: Any, settings: Settings
) -> None:
    call(client, "chordbeat.apply_schedule", definition={"name": "nightly", "every": 3600, "steps": [step("s")]})
    # Asked why (the dashboard requires a reason), then whether; Enter at the question: the default, no.
    replies = {"why pause nightly?": "maintenance\n", "[y/N]": "\n"}
    status, output = in_terminal(settings, "pause", "nightly", replies=replies)
    assert status == 1 and "pause nightly (active, next run in " in output and "because: maintenance?" in output, output
    assert call(client, "chordbeat.get_schedule", name="nightly")["status"] == "active"
    # Hostile names and reasons are refused by the service, naming the field; nothing changes.
    for flag, value, field in (("--as", "eve\x1b[2J", "actor"), ("--reason", "r" * 501, "reason")):
        refused = cli("pause", "nightly", "--yes", flag, value)
        assert refused.exit_code == 1 and field in refused.output and "\x1b[2J" not in refused.output, refused.output
    assert call(client, "chordbeat.get_schedule", name="nightly")["status"] == "active"
    env = {"CHORDBEAT_ACTOR": "bob", "TZ": "Asia/Kolkata"}
    status, output = in_terminal(
        settings, "pause", "nightly", "--reason", "bank holiday", env=env, replies={"[y/N]": "y\n"}
    )
    assert status == 0 and "nightly: paused" in output, output
    shown = "\n".join(plain_lines(RICH_STYLE.sub("", in_terminal(settings, "show", "nightly", env=env)[1])))
    assert re.search(
        r"paused by bob since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \+00:00 UTC, (\d{4}-\d\d-\d\d )?\d\d:\d\d IST here,\s",
        shown,
    ), shown
    assert re.search(r"(ago|now):\s+bank\s+holiday", shown), shown


def test_delete_asks_first(app: ChordbeatCelery, worker: Any, client: Any, settings: Settings) -> None:
    call(client, "chordbeat.apply_schedule", definition={"name": "old", "every": 3600, "steps": [step("s")]})
    status, output = in_terminal(settings, "delete", "old", replies={"[y/N]": "n\n"})
    assert status == 1 and "delete schedule old (active, 1 steps;" in output, output
    assert call(client, "chordbeat.get_schedule", name="old")["status"] == "active"
    assert "old: deleted" in cli("delete", "old", "--yes", "--reason", "replaced by new").output
    assert "does not exist" in cli("show", "old").output


def test_audit_lists_who_did_what_from_every_source_in_80_columns(
    app: ChordbeatCelery, worker: Any, client: Any, settings: Settings
) -> None:
    definition = {
        "name": "s",
        "every": 3600,
        "overlap": "cancel_previous",
        "steps": [step("x", kwargs={"seconds": 30})],
    }
    call(client, "chordbeat.apply_schedule", definition=definition)  # another service: source "service"
    assert cli("pause", "s", "--yes", "--as", "carol", "--reason", "maintenance window until noon").exit_code == 0
    assert cli("resume", "s", "--as", "carol").exit_code == 0
    first = call(client, "chordbeat.trigger_schedule", name="s")["execution_id"]
    second = call(client, "chordbeat.trigger_schedule", name="s")["execution_id"]  # beat cancels the first
    assert finished(client, first)["status"] == "cancelled"
    call(client, "chordbeat.cancel_execution", execution_id=second)
    status, output = in_terminal(settings, "audit", "--schedule", "s", env={"TZ": "Asia/Kolkata"})
    assert status == 0, output
    lines = plain_lines(RICH_STYLE.sub("", output))
    assert not wide_lines(lines), "\n".join(lines)
    assert not time_format_problems(lines), (time_format_problems(lines), "\n".join(lines))
    text = "\n".join(lines)
    for word in ("carol", "claims", "cli", "service", "beat", "pause", "resume", f"#{first}", f"#{second}", "cancel"):
        assert word in text, (word, text)
    assert not words_broken(text, "maintenance window until noon"), text
    assert "(Europe/London)" not in text and "IST here" in text  # the schedule's zone (UTC), the viewer's beside
    rows = json.loads(cli("audit", "--schedule", "s", "--json").output)
    # The CLI's calls go over the broker, where anyone may claim to be the CLI: service, claim kept.
    assert {r["source"] for r in rows} == {"service", "beat"}, rows
    assert {r["detail"]["claimed_source"] for r in rows if r["actor"] == "carol"} == {"cli"}, rows
    assert rows[0]["action"] == "cancel"  # newest first


def test_execution_shows_output_and_the_last_lines_of_traceback_and_log(
    app: ChordbeatCelery, worker: Any, client: Any, settings: Settings
) -> None:
    failing = step("import people", "tests.cli.noisy_fail", kwargs={"lines": 30, "depth": 25, "message": "no file"})
    definition = {"name": "hr", "every": 3600, "steps": [step("fetch"), failing]}
    call(client, "chordbeat.apply_schedule", definition=definition)
    execution_id = call(client, "chordbeat.trigger_schedule", name="hr")["execution_id"]
    assert finished(client, execution_id)["status"] == "failed"
    status, output = in_terminal(settings, "execution", str(execution_id))
    assert status == 0, output
    lines = plain_lines(RICH_STYLE.sub("", output))
    text = "\n".join(lines)
    assert not wide_lines(lines), text
    assert 'group 1 fetch (try 1): output: {"slept": 0.05}' in text, text
    assert re.search(r"traceback, last 20 of \d+ lines \(--full\)", text), text
    assert "StepFailed: no file" in text and "raise StepFailed(message)" in text, text
    assert "log, last 20 of 30 lines (--full)" in text and "log line 30 of 30" in text, text
    assert "log line 10 of 30" not in text and "log line 11 of 30" in text, text
    assert "Traceback (most recent call last)" not in text  # its first line is more than 20 lines up
    full = "\n".join(
        plain_lines(RICH_STYLE.sub("", in_terminal(settings, "execution", str(execution_id), "--full")[1]))
    )
    assert "Traceback (most recent call last)" in full and "log line 1 of 30" in full, full


#: A failure message longer than a line, its words shorter than 40 characters.
WORDY = (
    "the directory server at ldap-primary.example.internal refused the bind for "
    "uid=svc-hr-sync,ou=services,dc=example,dc=internal because its password expired; "
    "ask the identity team to rotate it and retry"
)


def words_broken(text: str, message: str) -> list[str]:
    """The words of ``message`` (shorter than 40 characters) that do not appear whole in ``text``."""
    return [word for word in message.split() if len(word) < 40 and word not in text]


def test_run_wait_keeps_its_columns_and_rows_still_and_wraps_errors_at_words(
    app: ChordbeatCelery, worker: Any, client: Any, settings: Settings
) -> None:
    steps = [
        step("fetch", kwargs={"seconds": 1.5}),
        [step("export to bank", kwargs={"seconds": 1}), step("b", kwargs={"seconds": 2})],
        step("load", "chordbeat.examples.fail", kwargs={"message": WORDY}),
    ]
    call(client, "chordbeat.apply_schedule", definition={"name": "wordy", "every": 3600, "steps": steps})
    status, output = in_terminal(settings, "run", "wordy", "--wait")
    assert status == 1, output
    # Rich's live display redraws a frame after erasing the last one line by line.
    raw_frames = re.split(r"(?:\x1b\[2K\x1b\[1A)+\x1b\[2K", output)
    frames = [plain_lines(RICH_STYLE.sub("", frame)) for frame in raw_frames if "try" in frame]
    frames = [[line for line in lines if line.strip()] for lines in frames]
    assert len(frames) > 3, output
    headers = {
        next(line for line in lines if re.search(r"group\s+step\s+state\s+try\s+took", line)) for lines in frames
    }
    assert len(headers) == 1, headers  # the same header, at the same offsets, in every frame
    for name in ("fetch", "export to bank", "b", "load"):
        rows = [[line for line in lines if re.match(rf"\s+\d\s+{name}\s\s", line)] for lines in frames]
        assert all(len(found) == 1 for found in rows), (name, rows)  # every step a row in every frame
        offsets = {re.search(r"\s\s(running|queued|waiting|completed|failed)\b", found[0]).start() for found in rows}
        assert len(offsets) == 1, (name, offsets)
    text = "\n".join(frames[-1])
    assert "waiting_for" not in output and "waiting" in output
    assert not wide_lines(frames[-1]), text
    assert not words_broken(text, WORDY), (words_broken(text, WORDY), text)
    for command in (("executions",), ("execution", "1")):
        shown = "\n".join(plain_lines(RICH_STYLE.sub("", in_terminal(settings, *command)[1])))
        assert not words_broken(shown, WORDY), (command, words_broken(shown, WORDY), shown)
        assert re.search(r"^    \S", shown, re.M), f"no hanging indent: {shown}"


def test_rerun_from_the_failed_group_waits_and_says_what_it_reran(
    app: ChordbeatCelery, worker: Any, client: Any, settings: Settings
) -> None:
    steps = [step("fetch"), step("load", "chordbeat.examples.fail", kwargs={"message": "bank was down"})]
    call(client, "chordbeat.apply_schedule", definition={"name": "bank", "every": 3600, "steps": steps})
    failed = finished(client, call(client, "chordbeat.trigger_schedule", name="bank")["execution_id"])
    status, output = in_terminal(settings, "rerun", str(failed["id"]), "--from-failed", "--wait", "--as", "dave")
    text = "\n".join(plain_lines(RICH_STYLE.sub("", output)))
    assert status == 1, text  # the step fails again: the re-run failed too
    rerun = json.loads(cli("executions", "--schedule", "bank", "--json").output)[0]
    assert rerun["id"] != failed["id"] and rerun["trigger"] == "manual"
    assert f"execution {rerun['id']} of bank: failed" in text, text
    assert f"re-run of execution {failed['id']} from group 2" in text, text
    # Group 1 is taken from the failed run: shown as completed there, not run again.
    assert re.search(r"^\s+2\s+load\s+failed", text, re.M), text
    assert re.search(r"^\s+1\s+fetch\s+completed earlier\s", text, re.M), text
    assert re.search(r"group 1 \S+ 1/1", text), text  # its bar counts it done
    rows = json.loads(cli("audit", "--schedule", "bank", "--json").output)
    assert any(
        (r["action"], r["actor"], r["source"], r["execution_id"]) == ("rerun", "dave", "service", rerun["id"])
        for r in rows
    ), rows
    started = cli("rerun", str(failed["id"]))  # from the start, not waiting
    assert started.exit_code == 0 and re.search(
        rf"started: re-run of {failed['id']} from group 1$", started.output.strip()
    )
