"""Which tests are slow, found from what they start, so that no hand-kept list can rot.

Plain `pytest` and `make test-fast` (-m "not slow") leave out every test that starts
long-running processes of its own: subprocess workers, beat, Flower (tests.support.processes), Sentinel
groups, browsers, network namespaces, a PostgreSQL of its own (initdb takes seconds), outages of
Redis or PostgreSQL. A test is slow when its body, or a fixture it uses (directly or through
other fixtures), reaches one of these through the functions and classes of tests/ it names;
tests slow for other reasons (bench-like sizes) keep a `@pytest.mark.slow` by hand.
tests/conftest.py marks and checks with these; tests/test_markers.py guards them. The finding
reads code only (names in bytecode, followed in sorted order), so it marks the same tests on
every run and every machine (docs/testing.md).
"""

from __future__ import annotations

import inspect
import os
import subprocess
import types
from collections import Counter
from typing import Any

import pytest
from celery.contrib.testing.worker import start_worker

from tests.support.servers import PostgresServer

#: Objects whose use makes a test slow, besides anything from the modules in _SLOW_MODULE_PREFIXES:
#: a process of its own, a PostgreSQL of its own (initdb), and Celery's in-process worker, whose
#: tests wait on real task runs.
_SLOW_OBJECTS: tuple[object, ...] = (subprocess.Popen, PostgresServer, start_worker)
#: Modules whose objects start a browser.
_SLOW_MODULE_PREFIXES = ("selenium",)
#: Names of what takes a server away for seconds: an outage of Redis, a stopped or frozen
#: (SIGSTOP) PostgreSQL, a Redis replica syncing for a failover (about 5 s).
_SLOW_ATTRIBUTES = frozenset({"outage", "stop_server", "SIGSTOP", "replicaof"})
#: Not followed: the session's Redis and PostgreSQL start once (tests.support.servers' Popen) and every
#: test, fast or slow, runs on them.
_SHARED_SERVER_MODULES = frozenset({"tests.support.servers"})
#: Programs that only slow tests may start (a fast test that does fails at teardown, see below).
SLOW_PROGRAMS = frozenset({"celery", "flower", "redis-sentinel", "chromium", "chromedriver", "ip", "nft"})


def slow_reason(func: object, _seen: set[int] | None = None) -> str | None:
    """What in ``func`` (a test or fixture function, a class, a module's function) starts something
    slow, following the functions and classes of tests/ it names; None when nothing does."""
    seen = set() if _seen is None else _seen
    func = inspect.unwrap(func) if callable(func) else func  # type: ignore[arg-type]
    if id(func) in seen:
        return None
    seen.add(id(func))
    if inspect.isclass(func):
        if not func.__module__.startswith("tests.") or func.__module__ in _SHARED_SERVER_MODULES:
            return None
        for member in vars(func).values():
            found = slow_reason(getattr(member, "fget", member), seen)
            if found is not None:
                return f"{func.__name__}: {found}"
        return None
    code = getattr(func, "__code__", None)
    if code is None:
        return None
    names = _names(code)
    if names & _SLOW_ATTRIBUTES:
        return f"calls {sorted(names & _SLOW_ATTRIBUTES)[0]}"
    module_globals: dict[str, Any] = getattr(func, "__globals__", {})
    for name in sorted(names):
        target = module_globals.get(name)
        if inspect.ismodule(target):
            candidates = [getattr(target, attr) for attr in sorted(names) if hasattr(target, attr)]
        else:
            candidates = [target] if target is not None else []
        for candidate in candidates:
            found = _slow_object(candidate, seen)
            if found is not None:
                return found
    return None


def _slow_object(target: object, seen: set[int]) -> str | None:
    if any(target is slow for slow in _SLOW_OBJECTS):
        return f"uses {getattr(target, '__qualname__', target)}"
    module = getattr(target, "__module__", None) or ""
    if isinstance(module, str) and module.startswith(_SLOW_MODULE_PREFIXES):
        return f"uses {module}"
    if module.startswith("tests.") and module not in _SHARED_SERVER_MODULES and callable(target):
        found = slow_reason(target, seen)
        if found is not None:
            return f"{getattr(target, '__qualname__', target)} -> {found}"
    return None


def _names(code: types.CodeType) -> set[str]:
    """Globals and attributes a code object and the functions nested in it name."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def item_slow_reason(item: pytest.Item) -> str | None:
    """Why ``item`` is slow: its body, or a fixture in its closure (the session-wide servers aside)."""
    found = slow_reason(getattr(item, "function", None))
    if found is not None:
        return found
    info = getattr(item, "_fixtureinfo", None)
    for name in item.fixturenames if info is not None else []:  # type: ignore[attr-defined]
        for fixturedef in info.name2fixturedefs.get(name, ()):
            if fixturedef.scope == "session":
                continue
            found = slow_reason(fixturedef.func)
            if found is not None:
                return f"fixture {name}: {found}"
    return None


#: Programs started since the current test's setup began (argv[0] base names).
_started: list[str] = []


def record_start(event: str, args: tuple[Any, ...]) -> None:
    """Audit hook (sys.addaudithook): note each program subprocess.Popen starts."""
    if event != "subprocess.Popen":
        return
    executable, argv = args[0], args[1]
    if not isinstance(argv, list | tuple) or not argv:
        argv = [executable]
    # With shell=True the program is the shell: the command it runs is what was started.
    if len(argv) > 2 and argv[1] in ("-c", b"-c") and isinstance(argv[2], str | bytes):
        argv = os.fsdecode(argv[2]).split() or argv
    if isinstance(argv[0], str | bytes | os.PathLike):
        _started.append(os.path.basename(os.fsdecode(argv[0])))


def started_but_not_slow(item: pytest.Item | None) -> list[str]:
    """The slow programs ``item`` started although it is not marked slow; forgets what was started."""
    started = sorted(set(_started) & SLOW_PROGRAMS)
    _started.clear()
    return started if item is not None and item.get_closest_marker("slow") is None else []


#: The modules that take longest under `make test`, longest first (docs/testing.md, "How long it
#: takes"). xdist's `--dist loadfile` hands out whole modules in collection order, so one of these
#: collected late (they are spread over the alphabet) ran alone at the end, for minutes.
LONGEST_MODULES = (
    "test_chaos",
    "test_outages",
    "test_faults",
    # One plan of about 75-120 s (test_chaos_limits' docstring): handed out early, not last.
    "test_chaos_limits",
    "test_bad_input",
    "test_flower",
    "test_beat",
    "test_cli",
    "test_partitions",
    "test_deadline_alerts",
    "test_imports",
    "test_recovery",
    "test_crashes",
    "test_chaos_hosts",
    "test_clock",
    "test_backfill",
    "test_failover_clocks",
    "test_node_names",
    "test_lost_signals",
    "test_redis_failover",
    "test_clock_jump_load",
    "test_standby_failover",
    "test_limit_slots",
    "test_cli_manners",
    "test_alerts_cli",
    "test_backfill_cli",
    "test_dst_rules",
    "test_login",
)


def longest_first(items: list[pytest.Item]) -> None:
    """Put the tests of :data:`LONGEST_MODULES` first, in its order, then the other modules by how
    many slow tests they hold, most first (a slow test takes seconds, a fast one milliseconds): the
    modules handed out last are the short ones, and the workers finish together. Every module's
    tests stay together and in their order; modules alike keep theirs."""
    rank = {name: index for index, name in enumerate(LONGEST_MODULES)}
    slow = Counter(item.path.stem for item in items if item.get_closest_marker("slow") is not None)
    items.sort(key=lambda item: (rank.get(item.path.stem, len(rank)), -slow[item.path.stem]))
