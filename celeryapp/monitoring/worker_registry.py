"""What each live worker can run, published in Redis: definitions are checked against the workers.

A process that checks a definition (the CLI's ``apply``, beat applying its file, the control
worker answering ``apply_schedule``) imports only its own ``CHORDBEAT_TASK_MODULES``: asked alone,
it refuses a task the step workers have. So each worker publishes its queues, registered tasks
and step policy under :func:`keys.registry_key` when it is ready, refreshes the entry with its
liveness file, and deletes it on a clean stop; the entry expires ``REGISTRY_TTL_S`` after the
last refresh, so a dead worker drops out by itself. A step is checked against the workers that
consume its queue: a task any of them has registered, under any of their policies (the worker
that runs it checks again with its own). With no worker published, the checking process's own
registry is used, and the refusal says so.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import redis

from celeryapp.config import Settings
from celeryapp.domain.names import STEPS_QUEUE
from celeryapp.domain.step_policy import StepRules
from celeryapp.messaging import keys
from celeryapp.messaging.redis_client import get_redis

logger = logging.getLogger(__name__)

#: Seconds a worker's entry lives after its last refresh (refreshed every 10 s with the liveness file).
REGISTRY_TTL_S = 60
#: Worker names shown in a refusal; past that, how many more.
SHOWN_NODES = 3


@dataclass(frozen=True)
class WorkerEntry:
    """One live worker as it published itself."""

    node: str
    queues: frozenset[str]
    tasks: frozenset[str]
    rules: StepRules


class CheckedRules(NamedTuple):
    """The rules to check a definition with, and why they are this process's own, if they are."""

    rules: StepRules
    #: Said to the person applying: no worker answered for its tasks (``None`` when workers did).
    fallback: str | None


def publish(
    client: redis.Redis, node: str, queues: Iterable[str], tasks: Iterable[str], settings: Settings, *, ttl_s: int
) -> None:
    """Write (or refresh) ``node``'s entry: what it consumes, has registered, and lets a step run."""
    entry = {
        "queues": sorted(queues),
        "tasks": sorted(tasks),
        "step_tasks": list(settings.step_tasks),
        "step_kinds": sorted(settings.step_kinds),
        "executable_allow": list(settings.executable_allow),
        "sql_env_prefix": settings.sql_env_prefix,
    }
    pipe = client.pipeline(transaction=False)
    pipe.set(keys.registry_key(node), json.dumps(entry), ex=ttl_s)
    pipe.sadd(keys.REGISTRY_NODES_KEY, node)
    pipe.execute()


def forget(client: redis.Redis, node: str) -> None:
    """A cleanly stopped worker runs nothing more: its entry goes at once."""
    pipe = client.pipeline(transaction=False)
    pipe.delete(keys.registry_key(node))
    pipe.srem(keys.REGISTRY_NODES_KEY, node)
    pipe.execute()


def live_workers(client: redis.Redis) -> list[WorkerEntry]:
    """Every worker whose entry has not expired; names whose entry is gone leave the set."""
    nodes = sorted(n.decode() if isinstance(n, bytes) else str(n) for n in client.smembers(keys.REGISTRY_NODES_KEY))
    values = client.mget([keys.registry_key(node) for node in nodes]) if nodes else []
    gone = [node for node, value in zip(nodes, values, strict=True) if value is None]
    if gone:
        client.srem(keys.REGISTRY_NODES_KEY, *gone)
    entries = []
    for node, value in zip(nodes, values, strict=True):
        if value is not None:
            entry = _entry(node, value)
            if entry is not None:
                entries.append(entry)
    return entries


def refreshed_ago_s(client: redis.Redis, nodes: Collection[str]) -> dict[str, float]:
    """Seconds since each of ``nodes`` last refreshed its entry, by Redis's own clock: the entry's
    time to live counts down from ``REGISTRY_TTL_S`` (no host's clock is compared with another's).
    Nodes whose entry is gone are left out."""
    names = sorted(nodes)
    with client.pipeline(transaction=False) as pipe:
        for node in names:
            pipe.pttl(keys.registry_key(node))
        left_ms = pipe.execute()
    return {node: max(REGISTRY_TTL_S - int(ms) / 1000, 0.0) for node, ms in zip(names, left_ms, strict=True) if ms > 0}


def _entry(node: str, value: Any) -> WorkerEntry | None:
    try:
        raw = json.loads(value)
        tasks = frozenset(str(t) for t in raw["tasks"])
        return WorkerEntry(
            node,
            queues=frozenset(str(q) for q in raw["queues"]),
            tasks=tasks,
            rules=StepRules(
                tasks.__contains__,
                step_tasks=tuple(str(p) for p in raw["step_tasks"]),
                step_kinds=frozenset(str(k) for k in raw["step_kinds"]),
                executable_allow=tuple(str(p) for p in raw["executable_allow"]),
                sql_env_prefix=None if raw["sql_env_prefix"] is None else str(raw["sql_env_prefix"]),
            ),
        )
    except (ValueError, TypeError, KeyError):
        logger.warning("worker %s published an unreadable registry entry; it is left out", node)
        return None


def union(entries: Collection[WorkerEntry], queue: str) -> StepRules:
    """What a step on ``queue`` may run on the ``entries`` (that consume it): any one's tasks
    under any one's policy. A looser union than one worker's is safe: the worker that takes the
    step checks it again with its own rules before running it."""
    tasks = frozenset().union(*(e.tasks for e in entries))
    prefixes = {e.rules.sql_env_prefix for e in entries}
    names = sorted(e.node for e in entries)
    shown = ", ".join(names[:SHOWN_NODES]) + (
        f" and {len(names) - SHOWN_NODES} more" if len(names) > SHOWN_NODES else ""
    )
    return StepRules(
        tasks.__contains__,
        step_tasks=tuple(dict.fromkeys(p for e in entries for p in e.rules.step_tasks)),
        step_kinds=frozenset().union(*(e.rules.step_kinds for e in entries)),
        executable_allow=tuple(dict.fromkeys(p for e in entries for p in e.rules.executable_allow)),
        # Differing prefixes: any variable but the workers' own, as the loosest of them would allow.
        sql_env_prefix=prefixes.pop() if len(prefixes) == 1 else None,
        registry=f"on the workers of queue {queue!r} ({shown})",
    )


def rules_of(entries: Collection[WorkerEntry], local: StepRules, settings: Settings) -> CheckedRules:
    """Per queue, the rules of the live workers consuming it; ``local`` (this process's) for a
    queue none of them consumes, or everywhere when none published."""
    if not entries:
        return _own(local, settings, "no worker has published its tasks")

    def on_queue(queue: str | None) -> StepRules:
        name = queue or STEPS_QUEUE
        members = [e for e in entries if name in e.queues]
        if members:
            return union(members, name)
        return _own(local, settings, f"no live worker consumes queue {name!r}").rules

    return CheckedRules(replace(on_queue(None), per_queue=on_queue), None)


def _own(local: StepRules, settings: Settings, why: str) -> CheckedRules:
    """This process's rules, saying why and which task modules it imported."""
    modules = f"CHORDBEAT_TASK_MODULES={','.join(settings.task_modules) or '(not set)'}"
    return CheckedRules(
        replace(local, registry=f"in this process ({why}; {modules})"),
        f"{why}; checked against this process's tasks ({modules})",
    )


def checked_rules(settings: Settings, registered: Callable[[str], bool]) -> CheckedRules:
    """The rules a definition is checked with here: the live workers', else this process's."""
    local = StepRules.of(settings, registered)
    try:
        entries = live_workers(get_redis(settings.broker_url))
    except redis.RedisError as exc:
        return _own(local, settings, f"the workers' tasks could not be read ({exc})")
    return rules_of(entries, local, settings)


def step_rules(settings: Settings, registered: Callable[[str], bool]) -> StepRules:
    """:func:`checked_rules` for a caller that has no one to tell why (the service, beat): logged."""
    checked = checked_rules(settings, registered)
    if checked.fallback:
        logger.info("%s", checked.fallback)
    return checked.rules
