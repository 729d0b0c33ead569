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
from typing import NamedTuple

from celeryapp.errors import ConfigError
from celeryapp.redis_urls import DEFAULT_SENTINEL_MASTER, check_redis_url

#: Broker used when ``CHORDBEAT_BROKER_URL`` is unset: a Redis on this machine.
DEFAULT_BROKER_URL = "redis://127.0.0.1:6379/0"
#: Embedded default database; PostgreSQL is the production choice.
DEFAULT_DATABASE_URL = "sqlite:///chordbeat.db"
#: Seconds a running step's heartbeat key lives without a refresh.
DEFAULT_HEARTBEAT_TTL_S = 15.0
#: Seconds between two runs of the recovery task.
DEFAULT_RECOVERY_INTERVAL_S = 10.0
#: Seconds beat's loop may go without coming round before beat exits (with every thread's stack
#: on stderr) for its supervisor to restart it; also when ``chordbeat health beat`` reports it.
DEFAULT_BEAT_STALL_S = 120.0
#: Days finished executions and their activities are kept.
DEFAULT_RETENTION_DAYS = 90.0
#: The audit trail (who did what) is kept longer than the history it speaks of.
DEFAULT_AUDIT_RETENTION_DAYS = 400.0
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
#: Redis hands an unacked message to another consumer after this long. Crashed steps are
#: re-queued by heartbeat recovery much sooner; this is only the broker's last resort, so it is
#: kept well above any step's run time to avoid duplicate deliveries of long steps.
VISIBILITY_TIMEOUT_S = 6 * 3600
#: Where worker and beat write their liveness files by default.
DEFAULT_HEALTH_DIR = "/tmp"
#: Where ``chordbeat web`` listens unless told otherwise: this machine only.
DEFAULT_WEB_ADDRESS = "127.0.0.1"
DEFAULT_WEB_PORT = 8180
#: Longest name the CLI may say it acts as (``CHORDBEAT_ACTOR``, ``--as``).
MAX_ACTOR_CHARS = 100


class Variable(NamedTuple):
    """A ``CHORDBEAT_*`` variable as the README's configuration table documents it."""

    name: str
    #: The default, as the table shows it (Markdown).
    default: str
    meaning: str
    #: False for variables of the tooling (``make run``, the container image), not of :class:`Settings`.
    setting: bool = True


#: Every ``CHORDBEAT_*`` variable: the one source of docs/configuration.md's table.
VARIABLES = (
    Variable(
        "CHORDBEAT_BROKER_URL",
        f"`{DEFAULT_BROKER_URL}`",
        "Celery broker (Redis; `rediss://` and passwords supported), or a Sentinel list "
        "`sentinel://[:password@]host:port[/db];sentinel://host:port;...` (the password and database on the first "
        "entry; see [operations.md](operations.md#redis-sentinel))",
    ),
    Variable(
        "CHORDBEAT_RESULT_BACKEND",
        "the broker URL",
        "Celery result backend (Redis or a Sentinel list; chords join there)",
    ),
    Variable(
        "CHORDBEAT_REDBEAT_URL",
        "the broker URL",
        "where RedBeat keeps schedule entries and its lock (Redis or a Sentinel list)",
    ),
    Variable(
        "CHORDBEAT_SENTINEL_MASTER",
        f"`{DEFAULT_SENTINEL_MASTER}`",
        "the primary's name the Sentinels monitor, for every URL that is a Sentinel list",
    ),
    Variable(
        "CHORDBEAT_DATABASE_URL",
        f"`{DEFAULT_DATABASE_URL}`",
        "SQLAlchemy URL; PostgreSQL (`postgresql+psycopg://…`) for production",
    ),
    Variable("CHORDBEAT_SCHEDULES_FILE", "unset", "declarative schedule file applied when beat starts"),
    Variable("CHORDBEAT_HEARTBEAT_TTL", f"`{DEFAULT_HEARTBEAT_TTL_S:g}` (s)", "TTL of a running step's heartbeat key"),
    Variable("CHORDBEAT_RECOVERY_INTERVAL", f"`{DEFAULT_RECOVERY_INTERVAL_S:g}` (s)", "period of the recovery task"),
    Variable(
        "CHORDBEAT_BEAT_STALL",
        f"`{DEFAULT_BEAT_STALL_S:g}` (s)",
        "a beat whose loop has not come round for this long writes every thread's stack to stderr and exits "
        "(status 1) for its supervisor to restart it; `chordbeat health beat` fails after as long. At least 5; "
        "raise it if repairing all entries (at start, after Redis lost them) takes longer",
    ),
    Variable(
        "CHORDBEAT_TASK_MODULES",
        "unset",
        "modules with your step tasks (comma-separated), imported by every worker; steps are checked against them",
    ),
    Variable(
        "CHORDBEAT_RETENTION_DAYS",
        f"`{DEFAULT_RETENTION_DAYS:g}`",
        "finished executions older than this are deleted",
    ),
    Variable(
        "CHORDBEAT_AUDIT_RETENTION_DAYS",
        f"`{DEFAULT_AUDIT_RETENTION_DAYS:g}`",
        "audit rows (who did what, `chordbeat.list_audit`) older than this are deleted; kept longer than the "
        "executions by default, so the trail outlives the history it speaks of",
    ),
    Variable(
        "CHORDBEAT_HEALTH_DIR",
        f"`{DEFAULT_HEALTH_DIR}`",
        "where worker and beat write their liveness files; in a directory others can write to (`/tmp`), a private "
        "`chordbeat-<uid>` subdirectory (mode 0700) of it; one owned by another user, or a subdirectory that is a "
        "symlink or not private, is refused and `chordbeat health` says why",
    ),
    Variable(
        "CHORDBEAT_RUN_DIR",
        "`.run`",
        "`make run` only: where it keeps Redis data, Flower's state and its generated credentials (`local.env`, "
        "mode 0600)",
        setting=False,
    ),
    Variable(
        "CHORDBEAT_BENCH_RUNS",
        "`3`",
        "`make bench` only: how many times each scenario runs (medians need at least 3)",
        setting=False,
    ),
    Variable(
        "CHORDBEAT_ROLE",
        "`worker`",
        "container image only: the process (`worker` or `beat`) its health check asks `chordbeat health` about",
        setting=False,
    ),
    Variable(
        "CHORDBEAT_STEP_KINDS",
        "`task`",
        "step kinds definitions may use: add `executable` and/or `sql` to turn those on (anyone who can publish to "
        "the broker can then run what the next two settings allow; see [security-steps.md]"
        "(security-steps.md))",
    ),
    Variable(
        "CHORDBEAT_STEP_TASKS",
        f"`{','.join(DEFAULT_STEP_TASKS)}`",
        "comma-separated patterns (`fnmatch`, case-sensitive) of the task names a `task` step may run, e.g. "
        "`hr.*,billing.*`; Celery's own tasks (`celery.*`) and chordbeat's (`chordbeat.*` except "
        "`chordbeat.examples.*`) never qualify",
    ),
    Variable(
        "CHORDBEAT_EXECUTABLE_ALLOW",
        "unset (nothing)",
        "comma-separated absolute paths of the programs executable steps may run; an entry ending in `/` allows "
        "everything below that directory. Symlinks and `..` are resolved before the check. Required once "
        "`executable` is enabled (the worker refuses to start without it)",
    ),
    Variable(
        "CHORDBEAT_SQL_ENV_PREFIX",
        f"`{DEFAULT_SQL_ENV_PREFIX}`",
        "a sql step's `database_env` must name a variable starting with this (e.g. `CHORDBEAT_SQL_REPORTING`); "
        "chordbeat's own settings and `FLOWER_*` are refused whatever the prefix",
    ),
    Variable(
        "CHORDBEAT_WEB_USERS",
        "unset (`chordbeat web` refuses to start)",
        "dashboard accounts: `name:role:password` entries separated by commas; role `admin` (may run, pause, "
        "resume, cancel) or `viewer` (may look); password a hash from `chordbeat web-password` (or, on your own "
        "machine only, the password itself)",
    ),
    Variable(
        "CHORDBEAT_WEB_SECRET",
        "unset (`chordbeat web` refuses to start)",
        "at least 32 random characters that sign the dashboard's session cookies",
    ),
    Variable("CHORDBEAT_WEB_ADDRESS", f"`{DEFAULT_WEB_ADDRESS}`", "interface the dashboard listens on"),
    Variable("CHORDBEAT_WEB_PORT", f"`{DEFAULT_WEB_PORT}`", "port of the dashboard"),
    Variable(
        "CHORDBEAT_WEB_TRUSTED_PROXY",
        "unset (none)",
        "comma-separated addresses or networks (`10.0.0.5`, `10.0.0.0/24`) of the TLS-terminating proxy in front of "
        "the dashboard: only from them are `X-Forwarded-Proto` (HTTPS: `Secure`, `__Host-` cookies) and "
        "`X-Forwarded-For` (login throttling by the client's address) believed",
    ),
    Variable(
        "CHORDBEAT_ACTOR",
        "`user@host` of who runs the CLI",
        "who the `chordbeat` command says made a change (the actor of its audit rows); `--as NAME` overrides it",
    ),
    Variable(
        "CHORDBEAT_RESULT_EXPIRES",
        f"`{DEFAULT_RESULT_EXPIRES_S:g}` (s)",
        "how long Redis keeps a service call's answer (the only task results stored; steps, fires and "
        "advancements store none)",
    ),
)
#: Every variable the settings read: a sql step may never name one of them.
OWN_VARIABLES = frozenset(v.name for v in VARIABLES if v.setting)
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
    #: Dashboard accounts, ``name:role:password`` entries separated by commas (celeryapp/interfaces/web/auth.py).
    web_users: str = field(default="", repr=False)
    #: Key that signs the dashboard's session cookies.
    web_secret: str = field(default="", repr=False)
    web_address: str = DEFAULT_WEB_ADDRESS
    web_port: int = DEFAULT_WEB_PORT
    #: Networks of the TLS proxy whose X-Forwarded-Proto and X-Forwarded-For the dashboard believes.
    web_trusted_proxies: tuple[str, ...] = ()
    #: Seconds Redis keeps a stored task result; only service calls store one.
    result_expires_s: float = DEFAULT_RESULT_EXPIRES_S
    #: Who the CLI acts as; unset: the CLI's ``user@host``.
    actor: str | None = None

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
            web_users=env.get("CHORDBEAT_WEB_USERS", ""),
            web_secret=env.get("CHORDBEAT_WEB_SECRET", ""),
            web_address=env.get("CHORDBEAT_WEB_ADDRESS") or DEFAULT_WEB_ADDRESS,
            web_port=_web_port(env),
            web_trusted_proxies=_web_proxies(env),
            result_expires_s=_env_float(env, "CHORDBEAT_RESULT_EXPIRES", DEFAULT_RESULT_EXPIRES_S, minimum=60),
            actor=_actor(env),
        )
