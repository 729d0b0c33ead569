"""The ``chordbeat`` command against a real worker, through the service tasks."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import text

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.interfaces import listing
from celeryapp.interfaces.cli import main
from celeryapp.monitoring.health import touch
from models import transaction
from tests import processes
from tests.helpers import call, finished, step, wait_for

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
    settings: Settings, *args: str, columns: int = 80, timeout: float = 60, interrupt_on: str | None = None
) -> tuple[int, str]:
    """Run the real ``chordbeat`` in a pseudo-terminal ``columns`` wide: exit status and output.

    With ``interrupt_on``, the program gets a SIGINT (Ctrl-C) once its output shows that text.
    """
    env = processes.settings_env(settings, TERM="xterm-256color")
    for name in ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        env.pop(name, None)
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    attrs = termios.tcgetattr(follower)
    attrs[1] &= ~termios.OPOST  # bytes as written: a carriage return in the output came from the program
    termios.tcsetattr(follower, termios.TCSANOW, attrs)
    proc = subprocess.Popen([CHORDBEAT, *args], stdin=follower, stdout=follower, stderr=follower, env=env)
    os.close(follower)
    output = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.5)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the program has closed the terminal
                break
            if not chunk:
                break
            output += chunk
            if interrupt_on is not None and interrupt_on.encode() in output:
                proc.send_signal(signal.SIGINT)
                interrupt_on = None
        return proc.wait(10), output.decode("utf-8", "replace")
    finally:
        os.close(leader)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


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
    assert len(upcoming) == 3 and all(t.endswith("T02:00:00+09:00") for t in upcoming), upcoming
    assert "02:00:00 +09:00 JST, in " in cli("next", "ny", "-n", "2").output
    cli("run", "ny", "--wait")
    shown = json.loads(cli("show", "ny", "--json").output)
    assert shown["schedule"]["run_count"] == 1 and len(shown["executions"]) == 1
    assert shown["slots"][0]["outcome"] == "fired" and shown["slots"][0]["trigger"] == "manual"
    assert "recent executions" in cli("show", "ny").output
    executions = json.loads(cli("executions", "--schedule", "ny", "--json").output)
    assert executions[0]["status"] == "completed"
    assert json.loads(cli("pause", "ny", "--json").output)["status"] == "paused"
    assert "ny: active" in cli("resume", "ny").output


def test_cancel_from_the_cli(app: ChordbeatCelery, worker: Any, client: Any) -> None:
    call(
        client,
        "chordbeat.apply_schedule",
        definition={"name": "slow", "every": 60, "steps": [step("s", kwargs={"seconds": 30})]},
    )
    execution_id = call(client, "chordbeat.trigger_schedule", name="slow")["execution_id"]
    assert f"execution {execution_id}: cancelled" in cli("cancel", str(execution_id)).output


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


#: A time as the CLI shows it: wall time to the second, then (in tables on the next line) the
#: offset, the zone and how far from now.
WALL_TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
OFFSET_ZONE_RELATIVE = re.compile(r"[+-]\d\d:\d\d [A-Z]{2,5}, (in \d|\d.* ago|now)")
CURSOR = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def plain_lines(output: str) -> list[str]:
    return [line for line in CURSOR.sub("", output).replace("\r", "").split("\n")]


def test_every_view_fits_80_columns_with_one_time_format_and_no_microseconds(
    app: ChordbeatCelery, worker: Any, client: Any, settings: Settings
) -> None:
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
    views = {}
    for command in (
        ("list",),
        ("show", "nightly-hr-sync"),
        ("executions",),
        ("execution", str(failed["id"])),
        ("execution", str(ok["id"])),
        ("next", "nightly-hr-sync", "-n", "3"),
    ):
        status, output = in_terminal(settings, *command)
        assert status == 0, output
        lines = plain_lines(RICH_STYLE.sub("", output))
        assert all(len(line) <= 80 for line in lines), "\n".join(lines)
        text = "\n".join(lines)
        assert WALL_TIME.search(text) and OFFSET_ZONE_RELATIVE.search(text), text
        assert not re.search(r"\d\d:\d\d:\d\d\.\d", text), f"microseconds in {command}: {text}"
        assert "T02:00" not in text and "WARNING" not in text, text
        views[command[0] + (command[1] if command[0] == "execution" else "")] = text
    assert re.search(r"02:00:00 \+0[01]:00 (GMT|BST), in ", views["next"]), views["next"]
    failed_view = views[f"execution{failed['id']}"]
    assert re.search(r"^\s*1\s+HR System - Full Import\s+complete", failed_view, re.M), failed_view
    assert re.search(r"^\s*2\s+LDAP - Export\s+failed_with_error", failed_view, re.M), failed_view
    assert "LDAP - Export (try 1): StepFailed: LDAP said no" in failed_view
    assert "took" in failed_view and "finished" in failed_view
    assert "warning: 3 records skipped" in views[f"execution{ok['id']}"]
    assert "to " in views["executions"] and "LDAP said no" in views["executions"]
    assert "\x1b[" in in_terminal(settings, "executions")[1], "states are coloured in a terminal"


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
