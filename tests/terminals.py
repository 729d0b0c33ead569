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
    proc = subprocess.Popen(argv, stdin=follower, stdout=follower, stderr=follower, env=env, cwd=cwd)
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
                proc.send_signal(signal.SIGINT)
                interrupt_on = None
            for question in [q for q in replies if q.encode() in output]:
                os.write(leader, replies.pop(question).encode())
        return proc.wait(10), output.decode("utf-8", "replace")
    finally:
        os.close(leader)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def screen_lines(output: str) -> list[str]:
    """The lines a person sees: styling removed, each line as the terminal shows it."""
    return STYLE.sub("", output).replace("\r\n", "\n").split("\n")
