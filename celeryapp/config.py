"""Settings read once from ``CHORDBEAT_*`` environment variables.

Nothing else in the project reads ``os.environ``; everything takes a :class:`Settings`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from celeryapp.errors import ConfigError

#: Broker used when ``CHORDBEAT_BROKER_URL`` is unset: a Redis on this machine.
DEFAULT_BROKER_URL = "redis://127.0.0.1:6379/0"
#: Embedded default database; PostgreSQL is the production choice.
DEFAULT_DATABASE_URL = "sqlite:///chordbeat.db"
#: Seconds a running step's heartbeat key lives without a refresh.
DEFAULT_HEARTBEAT_TTL_S = 15.0
#: Seconds between two runs of the recovery task.
DEFAULT_RECOVERY_INTERVAL_S = 10.0
#: Days finished executions and their activities are kept.
DEFAULT_RETENTION_DAYS = 90.0
#: Seconds a stored task result (a service call's answer) is kept in Redis for its caller.
DEFAULT_RESULT_EXPIRES_S = 3600.0
#: Every step kind. Executable and SQL steps run programs and SQL on the workers for whoever can
#: publish to the broker, so they are off unless the operator turns them on.
STEP_KINDS = frozenset({"task", "executable", "sql"})
DEFAULT_STEP_KINDS = frozenset({"task"})
#: Task names (fnmatch patterns) steps may run; chordbeat's and Celery's own tasks never qualify.
DEFAULT_STEP_TASKS = ("*",)
#: Variables a sql step may name as its ``database_env`` start with this.
DEFAULT_SQL_ENV_PREFIX = "CHORDBEAT_SQL_"
#: Every variable the settings read: a sql step may never name one of them.
OWN_VARIABLES = frozenset(
    {
        "CHORDBEAT_BROKER_URL",
        "CHORDBEAT_RESULT_BACKEND",
        "CHORDBEAT_REDBEAT_URL",
        "CHORDBEAT_DATABASE_URL",
        "CHORDBEAT_SCHEDULES_FILE",
        "CHORDBEAT_HEARTBEAT_TTL",
        "CHORDBEAT_RECOVERY_INTERVAL",
        "CHORDBEAT_RETENTION_DAYS",
        "CHORDBEAT_TASK_MODULES",
        "CHORDBEAT_HEALTH_DIR",
        "CHORDBEAT_STEP_KINDS",
        "CHORDBEAT_STEP_TASKS",
        "CHORDBEAT_EXECUTABLE_ALLOW",
        "CHORDBEAT_SQL_ENV_PREFIX",
        "CHORDBEAT_RESULT_EXPIRES",
    }
)
_VARIABLE_PREFIX = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _env_list(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in env.get(name, "").split(",") if item.strip())


def _step_kinds(env: Mapping[str, str]) -> frozenset[str]:
    raw = env.get("CHORDBEAT_STEP_KINDS") or ",".join(sorted(DEFAULT_STEP_KINDS))
    kinds = frozenset(k.strip() for k in raw.split(","))
    if not kinds <= STEP_KINDS or "task" not in kinds:
        raise ConfigError(f"CHORDBEAT_STEP_KINDS: a comma-separated subset of {sorted(STEP_KINDS)} with 'task'")
    return kinds


def _executable_allow(env: Mapping[str, str], kinds: frozenset[str]) -> tuple[str, ...]:
    allow = _env_list(env, "CHORDBEAT_EXECUTABLE_ALLOW")
    for entry in allow:
        if not os.path.isabs(entry) or "\0" in entry:
            raise ConfigError(f"CHORDBEAT_EXECUTABLE_ALLOW: {entry!r} is not an absolute path")
    if "executable" in kinds and not allow:
        # Enabling the kind without saying which programs would refuse every step at run time.
        raise ConfigError(
            "CHORDBEAT_EXECUTABLE_ALLOW: executable steps are enabled, so list the programs (or directories "
            "ending in '/') they may run"
        )
    return allow


def _sql_env_prefix(env: Mapping[str, str]) -> str:
    prefix = env.get("CHORDBEAT_SQL_ENV_PREFIX") or DEFAULT_SQL_ENV_PREFIX
    if not _VARIABLE_PREFIX.match(prefix):
        raise ConfigError(f"CHORDBEAT_SQL_ENV_PREFIX: {prefix!r} is not the start of a variable name")
    upper = prefix.upper()
    if (
        any(v.startswith(prefix) for v in OWN_VARIABLES - {"CHORDBEAT_SQL_ENV_PREFIX"})
        or "FLOWER_".startswith(upper)
        or upper.startswith("FLOWER_")
    ):
        raise ConfigError(f"CHORDBEAT_SQL_ENV_PREFIX: {prefix!r} would let sql steps read the worker's own settings")
    return prefix


def _step_tasks(env: Mapping[str, str]) -> tuple[str, ...]:
    if not env.get("CHORDBEAT_STEP_TASKS"):
        return DEFAULT_STEP_TASKS
    patterns = _env_list(env, "CHORDBEAT_STEP_TASKS")
    if not patterns:
        raise ConfigError("CHORDBEAT_STEP_TASKS: a comma-separated list of task name patterns, such as 'hr.*'")
    return patterns


def _env_float(env: Mapping[str, str], name: str, default: float, *, minimum: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}: expected a number of seconds, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name}: must be at least {minimum}, got {raw!r}")
    return value


@dataclass(frozen=True)
class Settings:
    """Everything the processes need to know about their surroundings."""

    broker_url: str = DEFAULT_BROKER_URL
    result_backend: str = DEFAULT_BROKER_URL
    redbeat_url: str = DEFAULT_BROKER_URL
    database_url: str = DEFAULT_DATABASE_URL
    schedules_file: str | None = None
    heartbeat_ttl_s: float = DEFAULT_HEARTBEAT_TTL_S
    recovery_interval_s: float = DEFAULT_RECOVERY_INTERVAL_S
    retention_days: float = DEFAULT_RETENTION_DAYS
    #: Extra modules holding step tasks, imported by every worker.
    task_modules: tuple[str, ...] = field(default_factory=tuple)
    #: Where worker and beat write their liveness timestamps.
    health_dir: str = "/tmp"
    #: Step kinds definitions may use; ``task`` alone refuses executable and SQL steps.
    step_kinds: frozenset[str] = DEFAULT_STEP_KINDS
    #: Task name patterns (fnmatch) a ``task`` step may run.
    step_tasks: tuple[str, ...] = DEFAULT_STEP_TASKS
    #: Programs (absolute paths) and directories (ending in ``/``) executable steps may run.
    executable_allow: tuple[str, ...] = ()
    #: Start of the names of the variables sql steps take their database URL from.
    sql_env_prefix: str = DEFAULT_SQL_ENV_PREFIX
    #: The URLs sql steps may use, by variable name (those starting with ``sql_env_prefix``).
    sql_urls: Mapping[str, str] = field(default_factory=dict, repr=False)
    #: Seconds Redis keeps a stored task result; only service calls store one.
    result_expires_s: float = DEFAULT_RESULT_EXPIRES_S

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        broker = env.get("CHORDBEAT_BROKER_URL") or DEFAULT_BROKER_URL
        modules = tuple(m.strip() for m in env.get("CHORDBEAT_TASK_MODULES", "").split(",") if m.strip())
        kinds = _step_kinds(env)
        sql_prefix = _sql_env_prefix(env)
        return cls(
            broker_url=broker,
            result_backend=env.get("CHORDBEAT_RESULT_BACKEND") or broker,
            redbeat_url=env.get("CHORDBEAT_REDBEAT_URL") or broker,
            database_url=env.get("CHORDBEAT_DATABASE_URL") or DEFAULT_DATABASE_URL,
            schedules_file=env.get("CHORDBEAT_SCHEDULES_FILE") or None,
            heartbeat_ttl_s=_env_float(env, "CHORDBEAT_HEARTBEAT_TTL", DEFAULT_HEARTBEAT_TTL_S, minimum=1),
            recovery_interval_s=_env_float(
                env, "CHORDBEAT_RECOVERY_INTERVAL", DEFAULT_RECOVERY_INTERVAL_S, minimum=0.5
            ),
            retention_days=_env_float(env, "CHORDBEAT_RETENTION_DAYS", DEFAULT_RETENTION_DAYS, minimum=0),
            task_modules=modules,
            health_dir=env.get("CHORDBEAT_HEALTH_DIR") or "/tmp",
            step_kinds=kinds,
            step_tasks=_step_tasks(env),
            executable_allow=_executable_allow(env, kinds),
            sql_env_prefix=sql_prefix,
            sql_urls={
                name: url
                for name, url in env.items()
                if name.startswith(sql_prefix) and name != sql_prefix and name not in OWN_VARIABLES and url
            },
            result_expires_s=_env_float(env, "CHORDBEAT_RESULT_EXPIRES", DEFAULT_RESULT_EXPIRES_S, minimum=60),
        )
