"""The `slow` marker that `make test-fast` leaves out is found, not kept by hand (tests/support/slowness.py):
these tests make sure that what starts workers, beat, browsers, Sentinel or a lab is found, that a
fast test starting one anyway fails, and that `make test` deselects nothing."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker
from selenium import webdriver

from celeryapp.config import Settings
from tests.support import processes
from tests.support.chaos import Cluster
from tests.support.helpers import tells_databases_apart
from tests.support.lab import lab_servers
from tests.support.sentinel import SentinelCluster
from tests.support.servers import PostgresServer, RedisServer
from tests.support.slowness import LONGEST_MODULES, SLOW_PROGRAMS, longest_first, slow_reason, started_but_not_slow

ROOT = Path(__file__).resolve().parent.parent


# Never called: what the finding reads is their code.
def _starts_a_worker(settings: Settings, tmp: Path) -> None:
    with processes.worker(settings, tmp):
        pass


def _through_a_helper(settings: Settings, tmp: Path) -> None:
    _starts_a_worker(settings, tmp)


def _only_builds_an_environment(settings: Settings) -> dict[str, str]:
    return processes.settings_env(settings)


def _takes_redis_down(redis_server: RedisServer) -> None:
    redis_server.outage(3)


def _freezes_postgres(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)


def _own_postgres() -> None:
    PostgresServer().start()


def _in_a_nested_function(settings: Settings, tmp: Path) -> None:
    def inner() -> None:
        with processes.beat(settings, tmp):
            pass

    inner()


def _popen_directly() -> None:
    subprocess.Popen(["true"]).wait()


def _in_process_worker(app: Celery) -> None:
    with start_worker(app, pool="threads"):
        pass


def _browser() -> None:
    webdriver.Chrome().quit()


def _shared_servers(redis_server: RedisServer, postgres_server: PostgresServer) -> str:
    return redis_server.url + postgres_server.url()


def _quick_interpreter() -> None:
    subprocess.run(["true"], check=True)


@pytest.mark.parametrize(
    "func",
    [
        _starts_a_worker,
        _through_a_helper,
        _takes_redis_down,
        _freezes_postgres,
        _own_postgres,
        _in_a_nested_function,
        _popen_directly,
    ],
)
def test_what_starts_processes_or_outages_is_found_slow(func: Any) -> None:
    assert slow_reason(func) is not None


@pytest.mark.parametrize("func", [_only_builds_an_environment, _quick_interpreter])
def test_what_only_prepares_or_runs_a_quick_command_is_not(func: Any) -> None:
    assert slow_reason(func) is None


@pytest.mark.parametrize("helper", [lab_servers, SentinelCluster, Cluster, processes.Process])
def test_the_lab_sentinel_chaos_and_process_helpers_are_found_slow(helper: Any) -> None:
    assert slow_reason(helper) is not None


def test_the_in_process_worker_and_a_browser_are_slow_and_the_shared_servers_are_not() -> None:
    """The session's Redis and PostgreSQL are what the fast suite runs on; the tests of Celery's
    worker in this process wait on real task runs."""
    assert slow_reason(_in_process_worker) is not None
    assert slow_reason(_browser) is not None
    assert slow_reason(_shared_servers) is None


def test_a_fast_test_that_starts_a_worker_program_fails(request: pytest.FixtureRequest) -> None:
    """The check at teardown sees what a test really started (an audit hook on subprocess.Popen),
    so a way of starting workers the finding does not know cannot slip into the fast suite."""
    assert "celery" in SLOW_PROGRAMS and request.node.get_closest_marker("slow") is None
    done = subprocess.run([processes.CELERY, "--version"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert started_but_not_slow(request.node) == ["celery"]
    assert started_but_not_slow(request.node) == [], "forgotten once checked"


def test_a_worker_program_started_through_a_shell_is_seen(request: pytest.FixtureRequest) -> None:
    """With ``shell=True`` the program Popen starts is the shell; the command it runs is what counts."""
    done = subprocess.run(f"{processes.CELERY} --version", shell=True, capture_output=True, timeout=60, check=False)
    assert done.returncode == 0
    assert started_but_not_slow(request.node) == ["celery"]


def test_plain_pytest_leaves_the_slow_tests_out_and_make_test_runs_everything() -> None:
    """Plain `pytest` is the quick loop; `make test` (the README's and CI's command) runs every
    test, slow ones too: its -m "" comes after pyproject's -m and replaces it."""
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert re.search(r"(^|\s)-m 'not slow'($|\s)", ini["addopts"]), ini["addopts"]
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^test:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert recipe is not None
    (command,) = recipe.group(1).strip().splitlines()
    assert re.search(r'(^|\s)-m ""(\s|$)', command) and "not slow" not in command, command
    fast = re.search(r"^test-fast:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert fast is not None and '-m "not slow"' in fast.group(1)


def test_a_test_gets_30_seconds_unless_it_says_it_needs_longer(request: pytest.FixtureRequest) -> None:
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert ini["timeout"] == 30 and request.config.getini("timeout") == "30"
    assert request.node.get_closest_marker("timeout") is None


def _databases(request: pytest.FixtureRequest, name: str) -> list[str]:
    """The databases test ``name`` of this module runs on, as collected afresh."""
    module = request.node.getparent(pytest.Module)
    assert module is not None
    return sorted(
        item.callspec.params["database_url"]
        for item in module.collect()
        if isinstance(item, pytest.Function) and item.originalname == name
    )


def test_a_database_test_runs_on_sqlite_unless_it_asks_for_more(
    request: pytest.FixtureRequest, database_url: str
) -> None:
    # Not spelt "sqlite": a test naming a database kind is taken for one that tells them apart.
    assert database_url.startswith("sqlite:")
    only = database_url.partition(":")[0]
    assert _databases(request, "test_a_database_test_runs_on_sqlite_unless_it_asks_for_more") == [only]


@pytest.mark.both_databases
def test_a_test_marked_both_databases_runs_on_postgresql_too(request: pytest.FixtureRequest, database_url: str) -> None:
    assert _databases(request, "test_a_test_marked_both_databases_runs_on_postgresql_too") == ["postgresql", "sqlite"]


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_test_that_names_its_databases_keeps_its_choice(request: pytest.FixtureRequest, database_url: str) -> None:
    assert database_url.startswith("postgresql")
    assert _databases(request, "test_a_test_that_names_its_databases_keeps_its_choice") == ["postgresql"]


def test_a_test_that_tells_the_databases_apart_is_refused_unless_it_runs_on_both() -> None:
    """pytest_generate_tests fails the collection of such a test left on SQLite only: its
    PostgreSQL branch would never run."""

    def branches(database_url: str) -> None:
        if database_url.startswith("postgresql"):
            pass

    def only_uses_the_url(database_url: str) -> str:
        return database_url + "?mode=ro"

    assert tells_databases_apart(branches.__code__)
    assert not tells_databases_apart(only_uses_the_url.__code__)


def test_the_longest_modules_exist_and_come_first() -> None:
    """A module renamed or removed would drop out of the order without a word."""
    tests = Path(__file__).parent
    assert [name for name in LONGEST_MODULES if not (tests / f"{name}.py").exists()] == []
    modules = ("test_web", "test_chaos", "test_web", "test_few", "test_beat", "test_many", "test_many", "test_few")
    slow = {"test_many": True, "test_few": True, "test_web": False}
    marked = [(name, slow.get(name, True) and (name != "test_few" or index == 3)) for index, name in enumerate(modules)]
    items = [
        SimpleNamespace(path=tests / f"{name}.py", get_closest_marker=lambda _name, s=is_slow: True if s else None)
        for name, is_slow in marked
    ]
    longest_first(items)  # type: ignore[arg-type]
    # The listed ones first, then by slow tests held (two, one, none); each module's tests together.
    assert [item.path.stem for item in items] == [
        "test_chaos",
        "test_beat",
        "test_many",
        "test_many",
        "test_few",
        "test_few",
        "test_web",
        "test_web",
    ]
