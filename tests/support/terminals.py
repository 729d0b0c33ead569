"""Programs run in a pseudo-terminal of a given width, as a person at a terminal runs them."""

from __future__ import annotations

import fcntl
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

#: Rich's and click's styling (SGR): what a colour terminal gets besides the text.
STYLE = re.compile(r"\x1b\[[0-9;]*m")
#: Variables that would override what the terminal says of its size and colours.
_SIZE_AND_COLOUR = ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")


def in_pty(
    argv: list[str],
    env: dict[str, str],
    *,
    columns: int = 80,
    timeout: float = 60,
    cwd: str | None = None,
    interrupt_on: str | None = None,
    replies: dict[str, str] | None = None,
) -> tuple[int, str]:
    """Run ``argv`` with a terminal ``columns`` wide as stdin, stdout and stderr: exit status and
    the output as the terminal got it (carriage returns included, no newline translation).

    With ``interrupt_on``, the program gets a SIGINT (Ctrl-C) once its output shows that text;
    ``replies`` are typed once their question (the key) shows.
    """
    replies = dict(replies or {})
    env = {k: v for k, v in env.items() if k not in _SIZE_AND_COLOUR}
    env.setdefault("TERM", "xterm-256color")
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    attrs = termios.tcgetattr(follower)
    attrs[1] &= ~termios.OPOST  # bytes as written: a carriage return in the output came from the program
    termios.tcsetattr(follower, termios.TCSANOW, attrs)
    as_from_a_shell = [sys.executable, "-c", _AS_FROM_A_SHELL, *argv]
    proc = subprocess.Popen(as_from_a_shell, stdin=follower, stdout=follower, stderr=follower, env=env, cwd=cwd)
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
            except OSError:  # EIO: the program closed the terminal
                break
            if not chunk:
                break
            output += chunk
            if interrupt_on is not None and interrupt_on.encode() in output:
                _wait_until_blocked(proc)
                proc.send_signal(signal.SIGINT)
                interrupt_on = None
            for question in [q for q in replies if q.encode() in output]:
                os.write(leader, replies.pop(question).encode())
        try:
            return proc.wait(10), output.decode("utf-8", "replace")
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{argv} did not end: {_stuck(proc)}; its output ended {output[-300:]!r}") from None
    finally:
        os.close(leader)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


#: Run first in the child: the signal dispositions and mask a program started from a person's
#: shell has, whatever the test process inherited or set (a SIGINT ignored or blocked there would
#: be ignored by the program too, and Ctrl-C would do nothing); then the program itself, same pid.
_AS_FROM_A_SHELL = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "signal.pthread_sigmask(signal.SIG_SETMASK, ()); os.execvp(sys.argv[1], sys.argv[1:])"
)


def _stuck(proc: subprocess.Popen[bytes]) -> str:
    """Where a program that should have ended is: its signal masks and the system call it waits in."""
    try:
        with open(f"/proc/{proc.pid}/status") as status:
            signals = [line.replace("\t", " ") for line in status.read().splitlines() if line.startswith("Sig")]
        with open(f"/proc/{proc.pid}/syscall") as syscall:
            waiting_in = syscall.read().split()[:3]
    except FileNotFoundError:
        return "gone"
    return f"{', '.join(signals)}; system call {' '.join(waiting_in)}"


def _wait_until_blocked(proc: subprocess.Popen[bytes], within_s: float = 10) -> None:
    """Wait until ``proc`` sleeps in a system call other than a write, as a program does when a
    person presses Ctrl-C: waiting for input, or for an answer.

    A SIGINT that lands between a prompt's write and the read of the answer is only noted, and
    Python runs its handler once the read returns, which it never does: the program would wait
    for input a person would not see it waiting for (CI met this for ``delete``'s question). The
    write of input()'s own prompt can sleep too (on the terminal's lock, under load), so a sleep
    alone is not enough: the system call is read from /proc (its number first, else "running")."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with open(f"/proc/{proc.pid}/stat") as stat:
                sleeping = stat.read().rpartition(")")[2].split()[0] == "S"
            with open(f"/proc/{proc.pid}/syscall") as syscall:
                number = syscall.read().split(maxsplit=1)[0]
        except FileNotFoundError:
            return
        if sleeping and number.isdigit() and int(number) not in _WRITES:
            return
        time.sleep(0.01)


#: The write system calls' numbers on the machines CI runs on (x86-64, then arm64).
_WRITES = frozenset({1, 20} if os.uname().machine == "x86_64" else {64, 66})


def screen_lines(output: str) -> list[str]:
    """The lines a person sees: styling removed, each line as the terminal shows it."""
    return STYLE.sub("", output).replace("\r\n", "\n").split("\n")


#: The one time format: a date and wall time to the second, then (beside it, or in a table's cell
#: on the next line) the zone's offset; the viewer's wall time beside it says "here"; how far from now.
WALL_TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
OFFSET = re.compile(r"[+-]\d\d:\d\d\b")
RELATIVE = re.compile(r"\bin \d|\d+ (s|min|h|d) ago\b|\bnow\b")
CURSOR = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def plain_lines(output: str) -> list[str]:
    return [line for line in CURSOR.sub("", output).replace("\r", "").split("\n")]


#: A line naming the zone its wall times are in.
ZONE_TIME = re.compile(r"\b[A-Z][A-Za-z_]+/[A-Za-z_/+\-]+ time\b")


def time_format_problems(lines: list[str]) -> list[str]:
    """Where a view's times are not in the one format: ISO's T and Z, a clock time without its
    date, or a date and time without its offset (beside it, or below it in a table's cell)."""
    problems = []
    text = "\n".join(lines)
    problems += [f"ISO: {m.group()!r}" for m in re.finditer(r"T\d\d:|\d\dZ\b", text)]
    problems += [f"microseconds: {m.group()!r}" for m in re.finditer(r"\d\d:\d\d:\d\d\.\d", text)]
    for number, line in enumerate(lines):
        for m in re.finditer(r"\d\d:\d\d:\d\d", line):
            if not WALL_TIME.fullmatch(line[max(0, m.start() - 11) : m.end()]):
                problems.append(f"a time without its date: {line!r}")
        for m in WALL_TIME.finditer(line):
            below = lines[number + 1][m.start() :] if number + 1 < len(lines) else ""
            if not (OFFSET.match(line[m.end() :].lstrip()) or OFFSET.match(below)):
                problems.append(f"a time without its offset: {line!r}")
        if ZONE_TIME.search(line):
            continue  # a cadence's daily wall time ("at 02:00 every day, Europe/London time"), no instant
        for m in re.finditer(r"(?<![+\-:\d])\d\d:\d\d(?![:\d])", line):
            # Beside it, or below it where a narrow cell broke "2026-11-25 02:08 IST here" (the
            # viewer's date shows when it is another day there, as in India in the evening UTC).
            dated = re.search(r"\d{4}-\d\d-\d\d $", line[: m.start()])
            below = lines[number + 1][dated.start() if dated else m.start() :] if number + 1 < len(lines) else ""
            # Or at the end of a line of prose that wrapped there: "here" opens the next line.
            wrapped = not line[m.end() :].strip() and number + 1 < len(lines) and lines[number + 1].strip()
            if not (
                re.match(r" \S+ here\b", line[m.end() :])
                or re.match(r"\S+ here\b", below)
                or (wrapped and re.match(r"\S+ here\b", lines[number + 1].strip()))
            ):
                problems.append(f"a viewer's time without 'here': {line!r}")
    return problems


def wide_lines(lines: list[str], columns: int = 80) -> list[str]:
    return [line for line in lines if len(line) > columns]
