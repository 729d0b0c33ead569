"""Settings read once from ``CHORDBEAT_*`` environment variables.

Nothing else in the project reads ``os.environ``; everything takes a :class:`Settings`.
"""

from __future__ import annotations

import os
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
#: Every step kind; executable and SQL steps run code on workers, so they can be switched off.
STEP_KINDS = frozenset({"task", "executable", "sql"})
#: Days finished executions and their activities are kept.
DEFAULT_RETENTION_DAYS = 90.0


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
    step_kinds: frozenset[str] = STEP_KINDS

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        broker = env.get("CHORDBEAT_BROKER_URL") or DEFAULT_BROKER_URL
        modules = tuple(m.strip() for m in env.get("CHORDBEAT_TASK_MODULES", "").split(",") if m.strip())
        kinds = frozenset(k.strip() for k in env.get("CHORDBEAT_STEP_KINDS", ",".join(sorted(STEP_KINDS))).split(","))
        if not kinds <= STEP_KINDS or "task" not in kinds:
            raise ConfigError(f"CHORDBEAT_STEP_KINDS: a comma-separated subset of {sorted(STEP_KINDS)} with 'task'")
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
        )
