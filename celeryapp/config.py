"""Settings read once from ``CHORDBEAT_*`` environment variables.

Nothing else in the project reads ``os.environ``; everything takes a :class:`Settings`.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from celeryapp.errors import ConfigError
from celeryapp.redis_urls import DEFAULT_SENTINEL_MASTER, check_redis_url
from celeryapp.variables import (
    ALL_REMOTE_CONTROL,
    DEFAULT_ALERT_MISSED_GRACE_S,
    DEFAULT_ALERT_POLL_INTERVAL_S,
    DEFAULT_ALERT_RATE_LIMIT,
    DEFAULT_ALERT_RETRY_FOR_S,
    DEFAULT_ALERT_SEND_TIMEOUT_S,
    DEFAULT_ALERT_WATCH_INTERVAL_S,
    DEFAULT_AUDIT_RETENTION_DAYS,
    DEFAULT_BACKFILL_MAX_PENDING,
    DEFAULT_BACKFILL_MAX_PENDING_PER_SCHEDULE,
    DEFAULT_BACKFILL_MAX_STEP_RUNS,
    DEFAULT_BEAT_STALL_S,
    DEFAULT_BROKER_URL,
    DEFAULT_DATABASE_URL,
    DEFAULT_HEALTH_DIR,
    DEFAULT_HEARTBEAT_TTL_S,
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_RECOVERY_INTERVAL_S,
    DEFAULT_RESULT_EXPIRES_S,
    DEFAULT_RETENTION_DAYS,
    DEFAULT_SCHEDULE_FILE_MAX_BYTES,
    DEFAULT_SQL_ENV_PREFIX,
    DEFAULT_STEP_KINDS,
    DEFAULT_STEP_TASKS,
    DEFAULT_WEB_ADDRESS,
    DEFAULT_WEB_MAX_BODY_BYTES,
    DEFAULT_WEB_PORT,
    MAX_ACTOR_CHARS,
    MAX_ALERT_SEND_TIMEOUT_S,
    MAX_SCHEDULE_FILE_MAX_BYTES,
    MIN_ALERT_SEND_TIMEOUT_S,
    MIN_MAX_MESSAGE_BYTES,
    MIN_SCHEDULE_FILE_MAX_BYTES,
    MIN_WEB_MAX_BODY_BYTES,
    OWN_VARIABLES,
    STEP_KINDS,
    WORKER_CHANGING_COMMANDS,
)

_VARIABLE_PREFIX = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MASTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def _env_list(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in env.get(name, "").split(",") if item.strip())


def _step_kinds(env: Mapping[str, str]) -> frozenset[str]:
    raw = env.get("CHORDBEAT_STEP_KINDS") or ",".join(sorted(DEFAULT_STEP_KINDS))
    kinds = frozenset(k.strip() for k in raw.split(","))
    if not kinds <= STEP_KINDS or "task" not in kinds:
        raise ConfigError(f"CHORDBEAT_STEP_KINDS: a comma-separated subset of {sorted(STEP_KINDS)} with 'task'")
    return kinds


def _remote_control(env: Mapping[str, str]) -> frozenset[str]:
    commands = frozenset(_env_list(env, "CHORDBEAT_REMOTE_CONTROL"))
    unknown = commands - WORKER_CHANGING_COMMANDS - {ALL_REMOTE_CONTROL}
    if unknown:
        raise ConfigError(
            f"CHORDBEAT_REMOTE_CONTROL: {sorted(unknown)[0][:60]!r} is not a Celery command that changes a worker; "
            f"name some of {sorted(WORKER_CHANGING_COMMANDS)} or {ALL_REMOTE_CONTROL!r}"
        )
    return commands


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
        raise ConfigError(f"{name}: expected a number, got {raw!r}") from None
    # NaN passes every comparison and infinity overflows timers and date arithmetic later.
    if not math.isfinite(value):
        raise ConfigError(f"{name}: expected a finite number, got {raw!r}")
    if value < minimum:
        raise ConfigError(f"{name}: must be at least {minimum}, got {raw!r}")
    return value


def _alert_send_timeout(env: Mapping[str, str]) -> float:
    name = "CHORDBEAT_ALERT_SEND_TIMEOUT"
    value = _env_float(env, name, DEFAULT_ALERT_SEND_TIMEOUT_S, minimum=MIN_ALERT_SEND_TIMEOUT_S)
    if value > MAX_ALERT_SEND_TIMEOUT_S:
        raise ConfigError(
            f"{name}: must be at most {MAX_ALERT_SEND_TIMEOUT_S:g} (below the sender's 60 s claim on a delivery), "
            f"got {env[name]!r}"
        )
    return value


def _env_count(env: Mapping[str, str], name: str, default: int) -> int:
    """A whole number of at least 1 (a bound of 0 would refuse every backfill: say so instead)."""
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    if not raw.strip().isdecimal() or int(raw) < 1:
        raise ConfigError(f"{name}: expected a whole number of at least 1, got {raw!r}")
    return int(raw)


def _env_bytes(env: Mapping[str, str], name: str, default: int, *, minimum: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 12 or int(raw) < minimum:
        raise ConfigError(f"{name}: expected a number of bytes of at least {minimum}, got {raw[:40]!r}")
    return int(raw)


def _schedule_file_max_bytes(env: Mapping[str, str]) -> int:
    name = "CHORDBEAT_SCHEDULE_FILE_MAX_BYTES"
    value = _env_bytes(env, name, DEFAULT_SCHEDULE_FILE_MAX_BYTES, minimum=MIN_SCHEDULE_FILE_MAX_BYTES)
    if value > MAX_SCHEDULE_FILE_MAX_BYTES:
        raise ConfigError(
            f"{name}: must be at most {MAX_SCHEDULE_FILE_MAX_BYTES} (reading a file takes about 80 times its size "
            f"in memory), got {env[name][:40]!r}"
        )
    return value


def _redis_url(env: Mapping[str, str], name: str, default: str) -> str:
    url = env.get(name) or default
    try:
        check_redis_url(url)
    except ValueError as exc:
        # The reason never quotes the URL: it may hold a password.
        raise ConfigError(f"{name}: {exc}") from None
    return url


def _sentinel_master(env: Mapping[str, str]) -> str:
    name = env.get("CHORDBEAT_SENTINEL_MASTER") or DEFAULT_SENTINEL_MASTER
    if not _MASTER_NAME.fullmatch(name):
        raise ConfigError(
            f"CHORDBEAT_SENTINEL_MASTER: expected a name (letters, digits, '.', '_', '-'; at most 100), got {name!r}"
        )
    return name


def _actor(env: Mapping[str, str]) -> str | None:
    raw = env.get("CHORDBEAT_ACTOR") or None
    # The service refuses the same (models.audit.ACTOR_CHARS); said here, it names the variable.
    if raw is not None and (len(raw) > MAX_ACTOR_CHARS or not raw.isprintable() or not raw.strip()):
        raise ConfigError(f"CHORDBEAT_ACTOR: expected a name of 1 to {MAX_ACTOR_CHARS} printable characters")
    return raw


def _web_proxies(env: Mapping[str, str]) -> tuple[str, ...]:
    try:
        return tuple(str(ipaddress.ip_network(p)) for p in _env_list(env, "CHORDBEAT_WEB_TRUSTED_PROXY"))
    except ValueError as exc:
        raise ConfigError(f"CHORDBEAT_WEB_TRUSTED_PROXY: expected addresses or networks, {exc}") from None


#: The characters a dashboard address may hold: RFC 3986's, without quotes, angle brackets or spaces.
_PLAIN_URL = re.compile(r"[A-Za-z0-9._~:/?#\[\]@!$&()*+,;=%-]+")


def _dashboard_url(env: Mapping[str, str]) -> str | None:
    return _web_url(env, "CHORDBEAT_DASHBOARD_URL", "the dashboard's", "https://chordbeat.example.com")


def _web_url(env: Mapping[str, str], name: str, whose: str, example: str) -> str | None:
    raw = (env.get(name) or "").rstrip("/")
    if not raw:
        return None
    try:
        parts = urlsplit(raw)
        _ = parts.port  # raises ValueError for a port beyond 65535
        usable = parts.scheme in {"http", "https"} and bool(parts.hostname) and not (parts.query or parts.fragment)
    except ValueError:
        usable = False
    # Alerts put it in links people click (and in emails' HTML): nothing but a plain web address.
    if not usable or parts.username or parts.password or not _PLAIN_URL.fullmatch(raw):
        raise ConfigError(
            f"{name}: expected {whose} http:// or https:// address (no user, query or fragment), like {example}"
        )
    return raw


def environment_variable(name: str) -> str | None:
    """The value of a variable a deployment file names (an alert channel's URL or secret), read
    when it is used: files name variables, only this module reads the environment."""
    return os.environ.get(name) or None


def _web_port(env: Mapping[str, str]) -> int:
    raw = env.get("CHORDBEAT_WEB_PORT") or str(DEFAULT_WEB_PORT)
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= 65535:
        raise ConfigError(f"CHORDBEAT_WEB_PORT: expected a TCP port (1-65535), got {raw!r}")
    return int(raw)


@dataclass(frozen=True)
class Settings:
    """Everything the processes need to know about their surroundings."""

    broker_url: str = DEFAULT_BROKER_URL
    result_backend: str = DEFAULT_BROKER_URL
    redbeat_url: str = DEFAULT_BROKER_URL
    #: The primary's name the Sentinels know (used by the URLs that are Sentinel lists).
    sentinel_master: str = DEFAULT_SENTINEL_MASTER
    database_url: str = DEFAULT_DATABASE_URL
    schedules_file: str | None = None
    #: Largest schedule file read (``chordbeat apply``, beat's start); a larger one is refused unread.
    schedule_file_max_bytes: int = DEFAULT_SCHEDULE_FILE_MAX_BYTES
    heartbeat_ttl_s: float = DEFAULT_HEARTBEAT_TTL_S
    recovery_interval_s: float = DEFAULT_RECOVERY_INTERVAL_S
    beat_stall_s: float = DEFAULT_BEAT_STALL_S
    retention_days: float = DEFAULT_RETENTION_DAYS
    audit_retention_days: float = DEFAULT_AUDIT_RETENTION_DAYS
    #: Extra modules holding step tasks, imported by every worker.
    task_modules: tuple[str, ...] = field(default_factory=tuple)
    #: Where worker and beat write their liveness timestamps.
    health_dir: str = DEFAULT_HEALTH_DIR
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
    #: Celery control commands that change a worker which workers obey from the broker (``all``:
    #: every one); inspection commands are always answered (celeryapp/messaging/remote_control.py).
    remote_control: frozenset[str] = frozenset()
    #: Dashboard accounts, ``name:role:password`` entries separated by commas (celeryapp/interfaces/web/auth.py).
    web_users: str = field(default="", repr=False)
    #: Key that signs the dashboard's session cookies.
    web_secret: str = field(default="", repr=False)
    web_address: str = DEFAULT_WEB_ADDRESS
    web_port: int = DEFAULT_WEB_PORT
    #: Longest request body the dashboard reads (413 beyond).
    web_max_body_bytes: int = DEFAULT_WEB_MAX_BODY_BYTES
    #: Longest broker message a process decodes (celeryapp/messaging/serialization.py).
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    #: Networks of the TLS proxy whose X-Forwarded-Proto and X-Forwarded-For the dashboard believes.
    web_trusted_proxies: tuple[str, ...] = ()
    #: Seconds Redis keeps a stored task result; only service calls store one.
    result_expires_s: float = DEFAULT_RESULT_EXPIRES_S
    #: Who the CLI acts as; unset: the CLI's ``user@host``.
    actor: str | None = None
    #: The alert channels file (celeryapp/alerting/channels.py reads it); unset: no alert is sent.
    alert_channels_file: str | None = None
    alert_poll_interval_s: float = DEFAULT_ALERT_POLL_INTERVAL_S
    alert_watch_interval_s: float = DEFAULT_ALERT_WATCH_INTERVAL_S
    alert_retry_for_s: float = DEFAULT_ALERT_RETRY_FOR_S
    alert_rate_limit: int = DEFAULT_ALERT_RATE_LIMIT
    alert_send_timeout_s: float = DEFAULT_ALERT_SEND_TIMEOUT_S
    alert_missed_grace_s: float = DEFAULT_ALERT_MISSED_GRACE_S
    #: The dashboard's address for links in alerts; unset: alerts carry no links.
    dashboard_url: str | None = None
    #: Flower's address (the Health page links to it and asks it); unset: no Flower line.
    flower_url: str | None = None
    #: ``chordbeat metrics``' address (the Health page asks it); unset: no metrics line.
    metrics_url: str | None = None
    #: The directory of the named business calendars (one file per calendar); unset: none.
    calendars_dir: str | None = None
    backfill_max_pending_per_schedule: int = DEFAULT_BACKFILL_MAX_PENDING_PER_SCHEDULE
    backfill_max_pending: int = DEFAULT_BACKFILL_MAX_PENDING
    backfill_max_step_runs: int = DEFAULT_BACKFILL_MAX_STEP_RUNS

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        broker = _redis_url(env, "CHORDBEAT_BROKER_URL", DEFAULT_BROKER_URL)
        modules = tuple(m.strip() for m in env.get("CHORDBEAT_TASK_MODULES", "").split(",") if m.strip())
        kinds = _step_kinds(env)
        sql_prefix = _sql_env_prefix(env)
        return cls(
            broker_url=broker,
            result_backend=_redis_url(env, "CHORDBEAT_RESULT_BACKEND", broker),
            redbeat_url=_redis_url(env, "CHORDBEAT_REDBEAT_URL", broker),
            sentinel_master=_sentinel_master(env),
            database_url=env.get("CHORDBEAT_DATABASE_URL") or DEFAULT_DATABASE_URL,
            schedules_file=env.get("CHORDBEAT_SCHEDULES_FILE") or None,
            schedule_file_max_bytes=_schedule_file_max_bytes(env),
            heartbeat_ttl_s=_env_float(env, "CHORDBEAT_HEARTBEAT_TTL", DEFAULT_HEARTBEAT_TTL_S, minimum=1),
            recovery_interval_s=_env_float(
                env, "CHORDBEAT_RECOVERY_INTERVAL", DEFAULT_RECOVERY_INTERVAL_S, minimum=0.5
            ),
            beat_stall_s=_env_float(env, "CHORDBEAT_BEAT_STALL", DEFAULT_BEAT_STALL_S, minimum=5),
            retention_days=_env_float(env, "CHORDBEAT_RETENTION_DAYS", DEFAULT_RETENTION_DAYS, minimum=0),
            audit_retention_days=_env_float(
                env, "CHORDBEAT_AUDIT_RETENTION_DAYS", DEFAULT_AUDIT_RETENTION_DAYS, minimum=0
            ),
            task_modules=modules,
            health_dir=env.get("CHORDBEAT_HEALTH_DIR") or DEFAULT_HEALTH_DIR,
            step_kinds=kinds,
            step_tasks=_step_tasks(env),
            executable_allow=_executable_allow(env, kinds),
            sql_env_prefix=sql_prefix,
            sql_urls={
                name: url
                for name, url in env.items()
                if name.startswith(sql_prefix) and name != sql_prefix and name not in OWN_VARIABLES and url
            },
            remote_control=_remote_control(env),
            web_users=env.get("CHORDBEAT_WEB_USERS", ""),
            web_secret=env.get("CHORDBEAT_WEB_SECRET", ""),
            web_address=env.get("CHORDBEAT_WEB_ADDRESS") or DEFAULT_WEB_ADDRESS,
            web_port=_web_port(env),
            web_max_body_bytes=_env_bytes(
                env, "CHORDBEAT_WEB_MAX_BODY_BYTES", DEFAULT_WEB_MAX_BODY_BYTES, minimum=MIN_WEB_MAX_BODY_BYTES
            ),
            max_message_bytes=_env_bytes(
                env, "CHORDBEAT_MAX_MESSAGE_BYTES", DEFAULT_MAX_MESSAGE_BYTES, minimum=MIN_MAX_MESSAGE_BYTES
            ),
            web_trusted_proxies=_web_proxies(env),
            result_expires_s=_env_float(env, "CHORDBEAT_RESULT_EXPIRES", DEFAULT_RESULT_EXPIRES_S, minimum=60),
            actor=_actor(env),
            alert_channels_file=env.get("CHORDBEAT_ALERT_CHANNELS") or None,
            alert_poll_interval_s=_env_float(
                env, "CHORDBEAT_ALERT_POLL_INTERVAL", DEFAULT_ALERT_POLL_INTERVAL_S, minimum=0.1
            ),
            alert_watch_interval_s=_env_float(
                env, "CHORDBEAT_ALERT_WATCH_INTERVAL", DEFAULT_ALERT_WATCH_INTERVAL_S, minimum=0.5
            ),
            alert_retry_for_s=_env_float(env, "CHORDBEAT_ALERT_RETRY_FOR", DEFAULT_ALERT_RETRY_FOR_S, minimum=3600),
            alert_rate_limit=int(_env_float(env, "CHORDBEAT_ALERT_RATE_LIMIT", DEFAULT_ALERT_RATE_LIMIT, minimum=1)),
            alert_send_timeout_s=_alert_send_timeout(env),
            alert_missed_grace_s=_env_float(
                env, "CHORDBEAT_ALERT_MISSED_GRACE", DEFAULT_ALERT_MISSED_GRACE_S, minimum=0
            ),
            dashboard_url=_dashboard_url(env),
            flower_url=_web_url(env, "CHORDBEAT_FLOWER_URL", "Flower's", "http://127.0.0.1:5555"),
            metrics_url=_web_url(
                env, "CHORDBEAT_METRICS_URL", "the metrics endpoint's", "http://127.0.0.1:9808/metrics"
            ),
            calendars_dir=env.get("CHORDBEAT_CALENDARS_DIR") or None,
            backfill_max_pending_per_schedule=_env_count(
                env, "CHORDBEAT_BACKFILL_MAX_PENDING_PER_SCHEDULE", DEFAULT_BACKFILL_MAX_PENDING_PER_SCHEDULE
            ),
            backfill_max_pending=_env_count(env, "CHORDBEAT_BACKFILL_MAX_PENDING", DEFAULT_BACKFILL_MAX_PENDING),
            backfill_max_step_runs=_env_count(env, "CHORDBEAT_BACKFILL_MAX_STEP_RUNS", DEFAULT_BACKFILL_MAX_STEP_RUNS),
        )
