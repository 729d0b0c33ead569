"""The stall watchdog, in processes of its own (it ends the process it is armed in)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
import threading

from celeryapp.monitoring.watchdog import StallWatchdog


def run(body: str) -> subprocess.CompletedProcess[str]:
    imports = "import time, threading\nfrom celeryapp.monitoring.watchdog import StallWatchdog\n"
    program = imports + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)


def test_a_loop_that_stops_feeding_it_ends_the_process_with_every_thread_stack() -> None:
    done = run(
        """
        def stuck_in_the_loop():
            threading.Event().wait()

        StallWatchdog(1).arm()
        threading.Thread(target=threading.Event().wait, name="bystander", daemon=True).start()
        stuck_in_the_loop()
        """
    )
    assert done.returncode == 1
    assert done.stderr.startswith("Timeout (0:00:01)!\n")
    assert "in stuck_in_the_loop" in done.stderr
    assert done.stderr.count("(most recent call first)") == 2


def test_a_fed_watchdog_waits_and_a_disarmed_one_never_fires() -> None:
    done = run(
        """
        watchdog = StallWatchdog(1)
        watchdog.arm()
        for _ in range(15):  # 1.5 s of work, fed every 0.1 s
            time.sleep(0.1)
            watchdog.feed()
        watchdog.disarm()
        time.sleep(1.5)
        watchdog.feed()  # a feed after disarming arms nothing
        time.sleep(1.5)
        print("still here")
        """
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "still here\n", "")


def test_it_is_never_armed_outside_the_main_thread() -> None:
    """``worker -B`` runs beat in a thread: its watchdog would end the whole worker."""
    armed: list[bool] = []
    watchdog = StallWatchdog(1)
    thread = threading.Thread(target=lambda: armed.append(watchdog.arm()))
    thread.start()
    thread.join()
    assert armed == [False] and not watchdog.armed


def test_without_a_usable_stderr_it_is_not_armed_and_nothing_fails() -> None:
    """``celery beat --detach`` and some supervisors leave no usable stderr: beat must still run."""
    closed = open(os.devnull, "w")  # noqa: SIM115
    closed.close()
    for stream in (closed, io.StringIO()):
        watchdog = StallWatchdog(1, stream=stream)
        assert watchdog.arm() is False and not watchdog.armed
        watchdog.feed()
        watchdog.disarm()
