"""Every ``CHORDBEAT_*`` variable: its name, default and meaning (docs/configuration.md's table
is made from :data:`VARIABLES`), and the defaults :class:`celeryapp.config.Settings` falls back to."""

from __future__ import annotations

from typing import NamedTuple

from celeryapp.redis_urls import DEFAULT_SENTINEL_MASTER

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
#: Largest request body the dashboard reads: its forms (login, actions, a backfill) are a few
#: hundred bytes; a longer body is refused with 413 before it is read.
DEFAULT_WEB_MAX_BODY_BYTES = 64 * 1024
MIN_WEB_MAX_BODY_BYTES = 1024
#: Largest broker message (kombu's envelope as stored in Redis, the base64 body inside it) a
#: process decodes. The largest legitimate one, an ``apply_schedule`` of a definition at
#: ``MAX_DEFINITION_BYTES`` (256 KiB) of non-ASCII text, is about 1 MiB (docs/security.md).
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
#: Below this, Celery's own messages (a worker's inspection replies) would be refused.
MIN_MAX_MESSAGE_BYTES = 64 * 1024
#: Largest schedule file ``chordbeat apply`` and beat read (refused before it is parsed). A file
#: of 100,000 minimal schedules is about 12 MB; reading one takes about 80 times its size in
#: memory at its peak (the YAML nodes and the values), so the ceiling bounds that near 2.5 GiB.
DEFAULT_SCHEDULE_FILE_MAX_BYTES = 4 * 1024 * 1024
MIN_SCHEDULE_FILE_MAX_BYTES = 4 * 1024
MAX_SCHEDULE_FILE_MAX_BYTES = 32 * 1024 * 1024
#: Seconds between two looks of the alert sender for deliveries that are due.
DEFAULT_ALERT_POLL_INTERVAL_S = 1.0
#: Seconds between two passes of the deadline watch (late runs, slots beat never fired).
DEFAULT_ALERT_WATCH_INTERVAL_S = 10.0
#: Seconds a delivery is retried (with backoff) before it is given up as failed.
DEFAULT_ALERT_RETRY_FOR_S = 24 * 3600.0
#: Alerts one channel is sent per minute; beyond that they go out as one summary.
DEFAULT_ALERT_RATE_LIMIT = 10
#: Seconds one send of an alert may take in all: name lookup, connection, TLS, the request and the
#: whole answer (a receiver that answers a byte a second is cut here, not after its last byte).
DEFAULT_ALERT_SEND_TIMEOUT_S = 30.0
MIN_ALERT_SEND_TIMEOUT_S = 1.0
#: Below the sender's claim on a delivery (``DELIVERY_LEASE_S``, 60 s): a send still going when its
#: claim lapses could be repeated by another sender.
MAX_ALERT_SEND_TIMEOUT_S = 50.0
#: Slots waiting to start in one schedule's running backfills (and catch-ups), the request's own
#: included: two requests of the most one may hold (10,000 slots) wait at a time.
DEFAULT_BACKFILL_MAX_PENDING_PER_SCHEDULE = 20_000
#: Slots waiting to start in every running backfill of the deployment, the request's included.
DEFAULT_BACKFILL_MAX_PENDING = 100_000
#: Step executions one schedule's backfills may still queue: its pending slots (the request's
#: included) times the steps of its plan; a 10-step schedule reaches it at 20,000 slots, a
#: 100-step one at 2,000.
DEFAULT_BACKFILL_MAX_STEP_RUNS = 200_000
#: Seconds past its due time a slot may go unfired before ``missed`` says beat is not firing it;
#: a ``catchup: none`` schedule's slot fired later than this does not run.
DEFAULT_ALERT_MISSED_GRACE_S = 120.0
#: Celery's remote control commands that change a worker (or, for ``hello``, its revoked set;
#: ``objgraph`` and ``mem*`` are costly): workers refuse them from the broker unless
#: ``CHORDBEAT_REMOTE_CONTROL`` names them (celeryapp/messaging/remote_control.py).
WORKER_CHANGING_COMMANDS = frozenset(
    {
        "shutdown",
        "pool_restart",
        "pool_grow",
        "pool_shrink",
        "autoscale",
        "rate_limit",
        "time_limit",
        "add_consumer",
        "cancel_consumer",
        "revoke",
        "revoke_by_stamped_headers",
        "terminate",
        "disable_events",
        "heartbeat",
        "election",
        "hello",
        "objgraph",
        "memdump",
        "memsample",
    }
)
#: ``CHORDBEAT_REMOTE_CONTROL=all``: every command Celery knows, as a plain Celery worker obeys.
ALL_REMOTE_CONTROL = "all"
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
    Variable(
        "CHORDBEAT_SCHEDULE_FILE_MAX_BYTES",
        f"`{DEFAULT_SCHEDULE_FILE_MAX_BYTES}`",
        "largest schedule file `chordbeat apply` and beat read; a larger one is refused before it is parsed, "
        f"naming this variable; from {MIN_SCHEDULE_FILE_MAX_BYTES} to {MAX_SCHEDULE_FILE_MAX_BYTES} (32 MiB: reading "
        "a file takes about 80 times its size in memory at its peak; see [scaling.md](scaling.md#the-applys-cost))",
    ),
    Variable("CHORDBEAT_HEARTBEAT_TTL", f"`{DEFAULT_HEARTBEAT_TTL_S:g}` (s)", "TTL of a running step's heartbeat key"),
    Variable(
        "CHORDBEAT_RECOVERY_INTERVAL",
        f"`{DEFAULT_RECOVERY_INTERVAL_S:g}` (s)",
        "period of the recovery task, and of a long step's question to the database whether its attempt still runs",
    ),
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
        "CHORDBEAT_LOCAL_REDIS_PORT",
        "`6379`",
        "`make run` only: the port of the Redis it starts (with a password) when none answers there and "
        "`CHORDBEAT_BROKER_URL` is unset",
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
        "CHORDBEAT_REMOTE_CONTROL",
        "unset (inspection only)",
        "Celery remote control commands that change a worker which workers obey from the broker, comma-separated "
        "(`revoke` for Flower's Revoke and Terminate buttons; `shutdown`, `pool_restart`, `rate_limit`, …), or "
        "`all`; unset, workers answer only the inspection commands Flower and `chordbeat` read and refuse (and "
        "log) the rest. Whoever can publish to the broker can then use them: see "
        "[security.md](security.md#remote-control)",
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
        "CHORDBEAT_WEB_MAX_BODY_BYTES",
        f"`{DEFAULT_WEB_MAX_BODY_BYTES}`",
        "longest request body the dashboard accepts; a longer one is refused with 413 before it is read "
        "(a chunked one once it passes the limit); at least 1024",
    ),
    Variable(
        "CHORDBEAT_MAX_MESSAGE_BYTES",
        f"`{DEFAULT_MAX_MESSAGE_BYTES}`",
        "longest broker message (as stored in Redis) a process decodes; a longer one is dropped undecoded and "
        "logged with its queue and size; at least 65536 (see [security.md](security.md#size-limits))",
    ),
    Variable(
        "CHORDBEAT_FLOWER_CONTROL",
        "`off`",
        "`on` lets a Flower login use Flower's task-publishing, result-reading and worker-control API and "
        "buttons (flower.cfg); off, they answer 403 and Flower only reads (see [flower.md](flower.md#read-only))",
        setting=False,
    ),
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
        "CHORDBEAT_ALERT_CHANNELS",
        "unset (no channels: a definition naming one is refused)",
        "YAML file naming the alert channels definitions may send to (webhook, Slack, email; see "
        "[alerts.md](alerts.md)); secrets come from the variables it names, never from the file",
    ),
    Variable(
        "CHORDBEAT_CALENDARS_DIR",
        "unset (no named calendars: a definition naming one is refused)",
        "directory of the business calendars definitions name in `calendar.calendars`: the file of a calendar is "
        "its name, one `YYYY-MM-DD` per line, `#` comments (see [schedules.md](schedules.md#business-calendars)); "
        "read at apply, at beat start and when a slot fires",
    ),
    Variable(
        "CHORDBEAT_SMTP_URL",
        "unset",
        "workers only: the mail server of the email channels that name no `smtp_url_env`, "
        "`smtp://[user:pass@]host:port` or `smtps://…` (a channel's variable, not a setting; see "
        "[alerts.md](alerts.md))",
        setting=False,
    ),
    Variable(
        "CHORDBEAT_ALERT_POLL_INTERVAL",
        f"`{DEFAULT_ALERT_POLL_INTERVAL_S:g}` (s)",
        "how often the worker that sends alerts looks for deliveries that are due",
    ),
    Variable(
        "CHORDBEAT_ALERT_WATCH_INTERVAL",
        f"`{DEFAULT_ALERT_WATCH_INTERVAL_S:g}` (s)",
        "how often deadlines are checked (late runs, predicted lateness, slots beat never fired)",
    ),
    Variable(
        "CHORDBEAT_ALERT_RETRY_FOR",
        f"`{DEFAULT_ALERT_RETRY_FOR_S:g}` (s)",
        "a delivery that keeps failing is retried with backoff for this long, then marked failed; at least 3600",
    ),
    Variable(
        "CHORDBEAT_ALERT_SEND_TIMEOUT",
        f"`{DEFAULT_ALERT_SEND_TIMEOUT_S:g}` (s)",
        "the longest one alert send may take in all (name lookup, connection, TLS, request and the whole "
        f"answer; webhooks, Slack and SMTP), then it counts as failed and is retried; "
        f"{MIN_ALERT_SEND_TIMEOUT_S:g} to {MAX_ALERT_SEND_TIMEOUT_S:g}",
    ),
    Variable(
        "CHORDBEAT_ALERT_RATE_LIMIT",
        f"`{DEFAULT_ALERT_RATE_LIMIT}`",
        "alerts sent to one channel per minute; the rest of that minute's go out as one summary",
    ),
    Variable(
        "CHORDBEAT_ALERT_MISSED_GRACE",
        f"`{DEFAULT_ALERT_MISSED_GRACE_S:g}` (s)",
        "a slot still unfired this long after it was due raises `missed` (beat or the workers are down); "
        "a `catchup: none` schedule's slot fired later than this does not run",
    ),
    Variable(
        "CHORDBEAT_BACKFILL_MAX_PENDING_PER_SCHEDULE",
        f"`{DEFAULT_BACKFILL_MAX_PENDING_PER_SCHEDULE}` (slots)",
        "slots one schedule's running backfills may hold not started yet, the new request's included; "
        "a request past it is refused naming `end` (wait for them, or cancel one)",
    ),
    Variable(
        "CHORDBEAT_BACKFILL_MAX_PENDING",
        f"`{DEFAULT_BACKFILL_MAX_PENDING}` (slots)",
        "the same across every schedule of the deployment",
    ),
    Variable(
        "CHORDBEAT_BACKFILL_MAX_STEP_RUNS",
        f"`{DEFAULT_BACKFILL_MAX_STEP_RUNS}` (step executions)",
        "step executions one schedule's backfills may still queue: its slots not started (the new "
        "request's included) times the steps of its plan; a request past it is refused naming `end`",
    ),
    Variable(
        "CHORDBEAT_DASHBOARD_URL",
        "unset (no links)",
        "the dashboard's address as people reach it (`https://chordbeat.example.com`), for links in alerts",
    ),
    Variable(
        "CHORDBEAT_FLOWER_URL",
        "unset (no Flower line)",
        "Flower's address as people reach it (`http://127.0.0.1:5555`): the dashboard's Health page links "
        "to it and asks its `/healthcheck` whether it answers (from the dashboard's host: where the two "
        "addresses differ, as between containers, the line says Flower does not answer)",
    ),
    Variable(
        "CHORDBEAT_METRICS_URL",
        "unset (no metrics line)",
        "the address of `chordbeat metrics`' endpoint (`http://127.0.0.1:9808/metrics`): the Health page "
        "asks it whether it answers",
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
