"""`make run` in a terminal, as a person runs it: the README's own-steps route in a fresh copy of
the checkout, alerts set up as docs/alerts.md says, and Ctrl-C typed at the terminal (the whole
foreground process group gets SIGINT), with and without ``| tee``."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import shutil
import signal
import struct
import subprocess
import termios
import threading
from pathlib import Path

import pytest

from tests.support.processes import started_by
from tests.support.servers import free_port, wait_for
from tests.support.terminals import in_pty, screen_lines

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def _take_the_terminal() -> None:
    """In the child, a session leader already (start_new_session): fd 0 becomes its controlling
    terminal, as a login shell's is, so ^C typed there signals its foreground process group."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    """A command run by a shell in a terminal of its own, its output read as it comes (a program
    writing to a full terminal would block), keys typed at it."""

    def __init__(self, command: str, env: dict[str, str], cwd: Path) -> None:
        self._leader, follower = pty.openpty()
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 80, 0, 0))
        self.proc = subprocess.Popen(
            ["bash", "-c", command],
            stdin=follower,
            stdout=follower,
            stderr=follower,
            env=env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_take_the_terminal,
        )
        os.close(follower)
        self._output = bytearray()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self._leader, 65536)
            except OSError:  # EIO: every process closed the terminal
                return
            if not chunk:
                return
            self._output += chunk

    def output(self) -> str:
        return bytes(self._output).decode("utf-8", "replace").replace("\r\n", "\n")

    def ctrl_c(self) -> None:
        os.write(self._leader, b"\x03")

    def ctrl_z(self) -> None:
        os.write(self._leader, b"\x1a")

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._reader.join(10)
        os.close(self._leader)


def fresh_copy(destination: Path) -> Path:
    """The checkout as a fresh clone has it (its files, not its state), sharing this venv."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    (destination / ".venv").symlink_to(ROOT / ".venv")
    # The venv is the one this test runs in: make must not rebuild it (through the link) because
    # this checkout's pyproject.toml changed since it was made.
    stamp = (ROOT / ".venv" / ".installed-stamp").stat().st_mtime
    for recipe_input in ("pyproject.toml", "constraints.txt"):
        os.utime(destination / recipe_input, (stamp - 1, stamp - 1))
    return destination


def wait_for_banner(terminal: Terminal, what: str) -> None:
    try:
        wait_for(lambda: "chordbeat is up" in terminal.output(), 180, 0.5, what=what)
    except AssertionError as missing:
        raise AssertionError(f"{missing}; the terminal showed:\n{terminal.output()[-3000:]}") from None


def no_process_left(marker: str) -> bool:
    return not started_by(marker)


#: A line at WARNING or above, as each process writes one: Celery's and chordbeat's
#: (``WARNING/MainProcess``), Flower's (tornado's ``[W 261128 21:04:27 …]``), Python's warnings.
_ALARMING = re.compile(r"\b(WARNING|ERROR|CRITICAL)\b|\[[WEC] \d{6} |Warning: |Traceback")
#: Lines allowed in a fresh start's log, and why.
_ALLOWED = (
    # Celery warns any worker run by root; CI runs as root, an operator's `make run` does not.
    *(("SecurityWarning: You're running the worker with superuser privileges",) if os.geteuid() == 0 else ()),
)


def alarming_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if _ALARMING.search(line) and not any(a in line for a in _ALLOWED)]


@pytest.mark.timeout(360)
def test_the_readmes_own_steps_route_then_ctrl_c_stops_everything_in_order(tmp_path: Path) -> None:
    readme = README.read_text()
    clone = fresh_copy(tmp_path / "chordbeat")
    # "Your first step": hr/steps.py as the README shows it, named in the example schedule.
    code = re.search(r"```python\n(# hr/steps.py\n.*?)```", readme, re.S)
    step = re.search(r"`(\{name: \"HR import\".*?\})`", readme)
    assert code and step, "the README shows the first step's module and its entry in a schedule"
    (clone / "hr").mkdir()
    (clone / "hr" / "__init__.py").write_text("")
    (clone / "hr" / "steps.py").write_text(code.group(1))
    examples = clone / "examples" / "schedules.yaml"
    text = examples.read_text()
    examples.write_text(text.replace("    steps:\n", f"    steps:\n      - {step.group(1)}\n", 1))
    start = "CHORDBEAT_TASK_MODULES=hr.steps make run"
    assert f"`{start}`" in readme and "`chordbeat run nightly-hr-sync --wait`" in readme
    # This machine's other Redis, dashboards and Flowers must not be in the way: ports of its own.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CHORDBEAT_", "FLOWER_", "VIRTUAL_ENV"))}
    env.update(
        HOME=str(tmp_path),
        CHORDBEAT_LOCAL_REDIS_PORT=str(free_port()),
        CHORDBEAT_WEB_PORT=str(free_port()),
        FLOWER_PORT=str(free_port()),
        # Alerts set up as docs/alerts.md says: every process gets the channels file.
        CHORDBEAT_ALERT_CHANNELS="deploy/alert-channels.yaml",
    )
    marker = f"CHORDBEAT_RUN_DIR={clone / '.run'}"
    log = clone / "make-run.log"
    terminal = Terminal(f"{start} 2>&1 | tee {log.name}", env, clone)
    try:
        wait_for_banner(terminal, "make run's banner")
        # A fresh start says nothing alarming, to its first recovery pass (some 10 s in): Flower
        # inspected before any worker was up (four WARNINGs), recovery warned of a gap.
        recovered = re.compile(r"Task chordbeat\.recover\[\S+\] succeeded")
        wait_for(lambda: recovered.search(log.read_text()), 60, 0.5, what="the first recovery pass")
        assert not alarming_lines(log.read_text()), "\n".join(alarming_lines(log.read_text()))

        # Another terminal, in the checkout: the README's commands, then an own file with alerts.
        other = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
        run = ". .run/cli.env; chordbeat run nightly-hr-sync --wait"
        status, shown = in_pty(["bash", "-c", run], other, cwd=str(clone))
        said = " ".join(line.strip() for line in screen_lines(shown))
        assert status == 0 and "HR import" in said, shown
        # "your own file", named as the README's example is: it leaves the example alone, and the
        # channels file docs/alerts.md set up is the CLI's too (cli.env names it).
        (clone / "schedules.yaml").write_text(
            "schedules:\n  - name: hr-import\n    every: 3600\n"
            "    alerts: {channels: [ops-webhook], on: [failed]}\n"
            f"    steps:\n      - {step.group(1)}\n"
        )
        apply = ". .run/cli.env; chordbeat apply schedules.yaml"
        status, shown = in_pty(["bash", "-c", apply], other, cwd=str(clone), replies={"[y/N]": "n\n"})
        lines = screen_lines(shown)
        assert status == 0 and all(len(line) <= 80 for line in lines), shown
        assert "+ hr-import" in lines and "applied (source schedules): added hr-import" in lines, shown
        assert "nightly-hr-sync" not in shown, shown

        # Ctrl-C, with the output going through tee.
        before = len(terminal.output())
        terminal.ctrl_c()
        assert terminal.proc.wait(90) == 0, terminal.output()[before:]
        wait_for(lambda: no_process_left(marker), 30, 0.2, what="every make run process to stop")
        stopping = terminal.output()[before:]
        logged = log.read_text()
        assert logged.rstrip().endswith(stopping.strip().splitlines()[-1].strip()), "tee kept the end of it"
        for alarming in ("Error 130", "Traceback", "Cannot connect to redis", "Connection refused", "ConnectionError"):
            assert alarming not in stopping, stopping
        assert "SIGINT received" in stopping and "steps1@" in logged
    finally:
        terminal.close()
        for pid in started_by(marker):
            os.kill(pid, signal.SIGKILL)

    # The next make run starts cleanly (nothing left holds its ports), and Ctrl-C without tee.
    terminal = Terminal(start, env, clone)
    try:
        wait_for_banner(terminal, "the second make run's banner")
        assert "Address already in use" not in terminal.output()
        # Both workers up first: honcho signals each process's whole group, so a prefork pool still
        # starting when Ctrl-C comes loses a pool process and Celery says "Could not start worker
        # processes" with a traceback (docs/operations.md); stopping a started one is the case here.
        wait_for(
            lambda: (
                re.search(r"steps1@\S+ ready\.", terminal.output())
                and re.search(r"control1@\S+ ready\.", terminal.output())
            ),
            90,
            0.2,
            what="both workers ready",
        )
        # Ctrl-Z first: nothing to suspend it to (make waits on), so it must not hang the terminal.
        terminal.ctrl_z()
        before = len(terminal.output())
        terminal.ctrl_c()
        assert terminal.proc.wait(90) == 0, terminal.output()[before:]
        wait_for(lambda: no_process_left(marker), 30, 0.2, what="every make run process to stop")
        stopping = terminal.output()[before:]
        assert "Error 130" not in stopping and "Traceback" not in stopping, stopping
    finally:
        terminal.close()
        for pid in started_by(marker):
            os.kill(pid, signal.SIGKILL)
