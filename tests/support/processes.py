"""Real ``celery`` processes (beat, prefork workers) for tests that crash things."""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from celeryapp.config import Settings
from celeryapp.domain.names import CONTROL_QUEUE, PUBLIC_QUEUE, STEPS_QUEUE

CELERY = str(Path(sys.executable).with_name("celery"))
ROOT = str(Path(__file__).resolve().parents[2])
#: Environment of workers that also run the fault tests' step tasks.
FAULT_TASKS_ENV = {"CHORDBEAT_TASK_MODULES": "tests.support.fault_tasks", "PYTHONPATH": ROOT}


def skewed(offset_s: int) -> dict[str, str]:
    """Environment making a process's wall clock ``offset_s`` off, as a host whose time sync broke
    (libfaketime; its monotonic clock stays true, as a real host's does). Children inherit it."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1"))
    if not found:
        pytest.fail("libfaketime is missing: make test installs Debian's faketime package")
    preload = f"{_true_sleep()}:{found[0]}"
    return {"LD_PRELOAD": preload, "FAKETIME": f"{offset_s:+d}s", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


def steppable_clock(offset_file: Path) -> dict[str, str]:
    """Like :func:`skewed`, with the offset read from ``offset_file`` (``+35s``) every second: a
    test steps the process's clock while it runs, as NTP steps a drifted host's."""
    env = skewed(0)
    del env["FAKETIME"]
    return {**env, "FAKETIME_TIMESTAMP_FILE": str(offset_file), "FAKETIME_CACHE_DURATION": "1"}


def _true_sleep() -> Path:
    """tests/support/faketime_sleep.c built once per user (it says why)."""
    return _shared_library("faketime_sleep.c")


def clock_shift_library() -> Path:
    """tests/support/clock_shift.c built once per user: preloaded (``LD_PRELOAD``) into a redis-server with
    ``CHORDBEAT_CLOCK_SHIFT_S`` or ``CHORDBEAT_CLOCK_SHIFT_FILE``, it shifts that server's clock."""
    return _shared_library("clock_shift.c")


def _shared_library(source_name: str) -> Path:
    source = Path(ROOT) / "tests" / "support" / source_name
    version = os.stat(source).st_mtime_ns
    built = Path(tempfile.gettempdir()) / f"chordbeat-{os.getuid()}" / f"{source.stem}-{version}.so"
    if not built.exists():
        built.parent.mkdir(mode=0o700, exist_ok=True)
        partial = built.with_suffix(f".{os.getpid()}.tmp")
        subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(partial), str(source)], check=True)
        partial.replace(built)
    return built


def settings_env(settings: Settings, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHORDBEAT_")}
    env.update(
        CHORDBEAT_BROKER_URL=settings.broker_url,
        CHORDBEAT_RESULT_BACKEND=settings.result_backend,
        CHORDBEAT_REDBEAT_URL=settings.redbeat_url,
        CHORDBEAT_SENTINEL_MASTER=settings.sentinel_master,
        CHORDBEAT_DATABASE_URL=settings.database_url,
        CHORDBEAT_HEARTBEAT_TTL=str(settings.heartbeat_ttl_s),
        CHORDBEAT_RECOVERY_INTERVAL=str(settings.recovery_interval_s),
        CHORDBEAT_BEAT_STALL=str(settings.beat_stall_s),
        CHORDBEAT_RETENTION_DAYS=str(settings.retention_days),
        CHORDBEAT_HEALTH_DIR=settings.health_dir,
        CHORDBEAT_STEP_KINDS=",".join(sorted(settings.step_kinds)),
        CHORDBEAT_STEP_TASKS=",".join(settings.step_tasks),
        CHORDBEAT_EXECUTABLE_ALLOW=",".join(settings.executable_allow),
        CHORDBEAT_SQL_ENV_PREFIX=settings.sql_env_prefix,
        PYTHONUNBUFFERED="1",
    )
    env.update(settings.sql_urls)
    if settings.schedules_file:
        env["CHORDBEAT_SCHEDULES_FILE"] = settings.schedules_file
    if settings.task_modules:
        env["CHORDBEAT_TASK_MODULES"] = ",".join(settings.task_modules)
    if settings.calendars_dir:
        env["CHORDBEAT_CALENDARS_DIR"] = settings.calendars_dir
    env.update(extra)
    return env


class Process:
    def __init__(self, argv: list[str], env: dict[str, str], log: Path, *, append: bool = False) -> None:
        self.log = log
        # A restarted process (same name) appends to its predecessor's log.
        self._file = log.open("ab" if append else "wb")
        # Own process group: SIGKILL of the group kills pool children too.
        self.proc = subprocess.Popen(argv, env=env, stdout=self._file, stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def signal_group(self, signum: int) -> None:
        """Send ``signum`` to the process and its pool children (SIGSTOP freezes the whole worker)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signum)

    def kill(self) -> None:
        """SIGKILL the whole process group: no cleanup, no lock release, no message restore."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self._file.close()

    def stop(self) -> None:
        """Warm shutdown: SIGTERM to the main process only, which stops its pool itself."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()
        self._file.close()

    def __enter__(self) -> Process:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


@contextmanager
def running(process: Process) -> Iterator[Process]:
    """Stop ``process`` (warm shutdown) when the block ends."""
    try:
        yield process
    finally:
        process.stop()


def beat_argv(tmp: Path, name: str = "beat") -> list[str]:
    """``celery beat`` keeping its local schedule file in ``tmp``."""
    return [CELERY, "-A", "celeryapp", "beat", "-l", "INFO", "--schedule", str(tmp / f"{name}-schedule")]


def start_beat(
    settings: Settings, tmp: Path, name: str = "beat", *, append: bool = False, env: dict[str, str] | None = None
) -> Process:
    return Process(beat_argv(tmp, name), settings_env(settings, **(env or {})), tmp / f"{name}.log", append=append)


def beat(
    settings: Settings, tmp: Path, name: str = "beat", env: dict[str, str] | None = None
) -> contextlib.AbstractContextManager[Process]:
    return running(start_beat(settings, tmp, name, env=env))


def worker_argv(name: str, concurrency: int, *, pool: str = "prefork", queues: str | None = None) -> list[str]:
    """``celery worker`` named ``name@<host>``, consuming ``queues`` (default: all of chordbeat's)."""
    argv = [CELERY, "-A", "celeryapp", "worker", "-l", "INFO", "-P", pool, "-c", str(concurrency)]
    argv += ["-n", f"{name}@%h", "--without-mingle", "--without-gossip"]
    return argv + (["-Q", queues] if queues else [])


def start_worker(
    settings: Settings,
    tmp: Path,
    name: str = "w1",
    concurrency: int = 2,
    *,
    append: bool = False,
    env: dict[str, str] | None = None,
) -> Process:
    """A prefork worker named ``name@<host>``; the same name again is the same node restarting."""
    argv = worker_argv(name, concurrency)
    return Process(argv, settings_env(settings, **(env or {})), tmp / f"{name}.log", append=append)


def worker(
    settings: Settings, tmp: Path, name: str = "w1", concurrency: int = 2, env: dict[str, str] | None = None
) -> contextlib.AbstractContextManager[Process]:
    return running(start_worker(settings, tmp, name, concurrency, env=env))


#: ``-Q`` of the control worker in every deploy file.
CONTROL_WORKER_QUEUES = f"{CONTROL_QUEUE},{PUBLIC_QUEUE}"


def step_worker(
    settings: Settings,
    tmp: Path,
    name: str = "steps",
    concurrency: int = 2,
    queues: str = STEPS_QUEUE,
    env: dict[str, str] | None = None,
) -> contextlib.AbstractContextManager[Process]:
    """A step worker of the deploy files: prefork, the steps queue (``-Q``) only."""
    argv = worker_argv(name, concurrency, queues=queues)
    return running(Process(argv, settings_env(settings, **(env or {})), tmp / f"{name}.log"))


def control_worker(
    settings: Settings,
    tmp: Path,
    name: str = "control",
    queues: str = CONTROL_WORKER_QUEUES,
    env: dict[str, str] | None = None,
) -> contextlib.AbstractContextManager[Process]:
    """The control worker of the deploy files: control and service calls only, in threads."""
    argv = worker_argv(name, 4, pool="threads", queues=queues)
    return running(Process(argv, settings_env(settings, **(env or {})), tmp / f"{name}.log"))


def started_by(marker: str) -> list[int]:
    """Pids of live processes whose environment holds ``marker`` (those a test started)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in environ and state != "Z":
            found.append(int(proc.name))
    return found
