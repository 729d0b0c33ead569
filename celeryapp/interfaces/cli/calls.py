"""What every command shares: the console, the app built on first use, the reference clock, the
viewer's zone, who acts, confirmations, and the service calls through a client (marked as the
CLI's in the audit trail) whose failures are said as the command's error."""

from __future__ import annotations

import getpass
import json
import re
import socket
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any
from zoneinfo import ZoneInfo

import click
from celery.exceptions import TimeoutError as CeleryTimeout
from rich.console import Console

from celeryapp.interfaces.terminal import hanging, printable, text_of

console = Console()


def built_app() -> Any:
    from celeryapp import app

    app.loader.import_default_modules()
    return app


def reference_now() -> datetime:
    """The reference clock's time (installed by the app: Redis's clock), not this host's."""
    from models import utcnow

    built_app()
    return utcnow()


def new_client() -> Any:
    from celeryapp.client import ChordbeatClient

    settings = built_app().settings
    return ChordbeatClient(
        settings.broker_url, settings.result_backend, sentinel_master=settings.sentinel_master, source="cli"
    )


class LocalZone(tzinfo):
    """The viewer's zone as the C library knows it, so times read as ``date`` shows them: ``TZ``
    (a zone name or a POSIX rule), else the system's zone; each instant with its own offset and
    abbreviation (summer time included)."""

    def fromutc(self, dt: datetime) -> datetime:
        local = datetime.fromtimestamp(dt.replace(tzinfo=UTC).timestamp(), UTC).astimezone()
        return local.replace(tzinfo=self)

    def _at(self, dt: datetime | None) -> datetime:
        wall = (dt or datetime.now()).replace(tzinfo=None)
        return datetime.fromtimestamp(time.mktime(wall.timetuple()), UTC).astimezone()

    def utcoffset(self, dt: datetime | None) -> timedelta | None:
        return self._at(dt).utcoffset()

    def dst(self, dt: datetime | None) -> timedelta | None:
        return timedelta(0)  # the offset already holds it; nothing adds to it

    def tzname(self, dt: datetime | None) -> str | None:
        return self._at(dt).tzname()


def viewer_zone() -> tzinfo:
    """The zone of whoever reads the output (:class:`LocalZone`)."""
    return LocalZone()


def zone_title(zone: tzinfo, now: datetime) -> str:
    """How a column names the zone its times are in: the zone's name, else its abbreviation."""
    return getattr(zone, "key", None) or now.astimezone(zone).tzname() or "local"


def acting(as_name: str | None) -> str:
    """Who the command says acts: ``--as``, else ``CHORDBEAT_ACTOR``, else ``user@host``."""
    if as_name is not None:
        return as_name  # the service checks it and names the field when it is not a name
    return built_app().settings.actor or f"{getpass.getuser()}@{socket.gethostname()}"


def confirm(question: str, yes: bool) -> None:
    """Go on only when the operator agreed: ``--yes``, or ``y`` to ``question`` on a terminal.

    Without a terminal to ask in (a script, a pipe) the command refuses rather than wait for an
    answer nobody will type; ``n`` (or just Enter) changes nothing and exits 1."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise click.ClickException(
            printable(f"not done: {question} needs confirmation; add --yes (no terminal to ask)")
        )
    try:
        agreed = click.confirm(printable(question), default=False, err=True)  # stdout stays the answer
    except click.Abort:  # Ctrl-C or end of input at the question: the cursor is still on its line
        click.echo("", err=True)
        agreed = False
    if not agreed:
        click.echo("nothing changed", err=True)
        sys.exit(1)


def ask_reason(question: str) -> str | None:
    """A reason typed at the terminal (asked again while blank); None without a terminal to ask
    in (a script, which may give --reason). Ctrl-C or end of input: nothing changed, exit 1."""
    if not sys.stdin.isatty():
        return None
    while True:
        try:
            typed = click.prompt(
                printable(f"{question} (kept in the audit trail)"), default="", show_default=False, err=True
            )
        except click.Abort:
            click.echo("\nnothing changed", err=True)
            sys.exit(1)
        if str(typed).strip():
            return str(typed).strip()


#: Said when no worker answers: the service tasks behind every command but ``apply``, ``db`` and
#: ``health`` need one.
NO_WORKER = (
    "no chordbeat worker is consuming the '{queue}' queue (none answered within {seconds:.0f} s); "
    "start one: `celery -A celeryapp worker -l INFO` (or `make run`), or a control worker with "
    "`-Q chordbeat.control,celery`"
)
_worker_seen = False


def forget_worker() -> None:
    """Each invocation checks for a worker once, afresh (tests run many in one process)."""
    global _worker_seen
    _worker_seen = False


#: Said when the broker refuses the CLI's login (no settings, or another deployment's).
BROKER_REFUSED = (
    "Authentication required: the broker ({url}) {error}. The CLI needs the deployment's settings, "
    "its Redis password among them: set CHORDBEAT_BROKER_URL (redis://:PASSWORD@host:port/0) and the "
    "other CHORDBEAT_* variables as the workers have them; with `make run`, load the file it writes: "
    "`. .run/cli.env` (docs/operations.md)"
)


def require_broker() -> None:
    """Fail at once when the broker refuses the login: kombu retries a refused connection as if it
    were down, for seconds, before anyone is told "Authentication required." with no hint."""
    import redis

    from celeryapp.domain.redaction import hide_secrets
    from celeryapp.messaging.redis_client import get_redis

    url = built_app().settings.broker_url
    try:
        get_redis(url).ping()
    except (redis.AuthenticationError, redis.ResponseError) as exc:
        # NOAUTH, WRONGPASS, or (RESP3) HELLO before AUTH: each as either, by the server's version.
        words = str(exc).lower()
        if not any(sign in words for sign in ("auth", "password", "hello")):
            return
        given = hide_secrets(url) != url  # a password in the URL shows as hidden
        error = "refused its password" if given else "asks for a password and CHORDBEAT_BROKER_URL gives none"
        raise click.ClickException(BROKER_REFUSED.format(url=hide_secrets(url), error=error)) from None
    except (redis.RedisError, OSError, ValueError):
        pass  # unreachable and the like: the worker probe below says so as it always did


def require_worker(client: Any) -> None:
    """Fail in seconds, saying what to start, instead of waiting out the call's timeout."""
    global _worker_seen
    from celeryapp.client import DEFAULT_PROBE_S, SERVICE_QUEUE

    if _worker_seen:
        return
    require_broker()
    if not client.worker_listening(DEFAULT_PROBE_S):
        raise click.ClickException(NO_WORKER.format(queue=SERVICE_QUEUE, seconds=DEFAULT_PROBE_S))
    _worker_seen = True


def call(method: str, *args: Any, **kwargs: Any) -> Any:
    with connected() as client:
        return getattr(client, method)(*args, **kwargs)


@contextmanager
def connected() -> Iterator[Any]:
    """A client for a command's calls; what goes wrong is said as the command's error."""
    client = new_client()
    try:
        require_worker(client)
        yield client
    except click.ClickException:
        raise
    except CeleryTimeout:
        raise click.ClickException(
            f"no answer within {client.timeout_s:.0f} s (workers busy?); a request no worker took by then "
            "expires and does nothing"
        ) from None
    except Exception as exc:  # the worker's message names what is wrong
        raise click.ClickException(printable(f"{exc}{did_you_mean(client, str(exc))}")) from None
    finally:
        client.close()


#: The service's refusal of a schedule's or a limit's name it does not know (scheduling/store.py,
#: execution/limit_store.py).
_UNKNOWN_SCHEDULE = re.compile(r"(schedule|limit) ('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\") does not exist")
#: Names a "did you mean" is chosen from: the first page of schedules, by name.
SUGGESTION_POOL = 5000


def did_you_mean(client: Any, error: str) -> str:
    """``; did you mean 'nightly'?`` for a schedule's (or a limit's) name the service does not know, when one it
    knows is close (difflib); else nothing. Asked only once the command already failed."""
    import ast
    import difflib

    found = _UNKNOWN_SCHEDULE.search(error)
    if found is None:
        return ""
    try:
        typed = ast.literal_eval(found[2])
        listed = client.list_limits() if found[1] == "limit" else client.list_schedules(limit=SUGGESTION_POOL)
        names = [s["name"] for s in listed]
    except Exception:
        return ""  # a hint, never a second error
    close = difflib.get_close_matches(typed, names, n=3, cutoff=0.6)
    if not close:
        close = [n for n in names if n.lower() == str(typed).lower()]
    if not close:
        return ""
    return "; did you mean " + " or ".join(repr(name) for name in close) + "?"


def zones_for(names: Iterable[str]) -> dict[str, ZoneInfo]:
    from celeryapp.interfaces.listing import zones_of

    with connected() as client:
        return zones_of(client, set(names))


def list_zone(schedules: set[str]) -> tuple[tzinfo, tzinfo | None]:
    """The zone a list's times are in, and the viewer's to show beside them: one schedule's rows in
    its zone (the viewer's beside it); rows of several schedules all in the viewer's zone, so that
    no two rows of a column are in different zones."""
    viewer = viewer_zone()
    if len(schedules) == 1:
        name = next(iter(schedules))
        if zone := zones_for([name]).get(name):
            return zone, viewer
    return viewer, None


#: A time option as a length from now: ``90m``, ``2h``, ``1d``.
DURATION = re.compile(r"(\d{1,6})\s*(m|min|h|d)")
_UNIT_S = {"m": 60, "min": 60, "h": 3600, "d": 86400}


def moment_of(text: str, now: datetime, zone: tzinfo, *, flag: str, ahead: bool) -> datetime:
    """A time option (``--until``, ``--since``): a length from now (``2h``: ahead of now or back
    from it), or a date and time, read in the viewer's zone when it names no offset of its own.
    Anything else is refused naming ``flag``."""
    if match := DURATION.fullmatch(text.strip()):
        length = timedelta(seconds=int(match[1]) * _UNIT_S[match[2]])
        return now + length if ahead else now - length
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(
            printable(f"{text!r} is neither a length (90m, 2h, 1d) nor a time (2026-11-25 06:00)"), param_hint=flag
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=zone)  # the wall time where they are
    return moment


def echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2))


def print_errors(executions: list[dict[str, Any]]) -> None:
    """Each run's error under a list, wrapped at words with a hanging indent."""
    for e in executions:
        if e["error"]:
            console.print(hanging(text_of(f"{e['id']}: ", "bold"), text_of(e["error"], "red")))


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
as_option = click.option(
    "--as",
    "as_name",
    default=None,
    metavar="NAME",
    help="Who acts, for the audit trail (default: $CHORDBEAT_ACTOR or user@host).",
)
yes_option = click.option("--yes", "-y", is_flag=True, help="Do it without asking.")
reason_option = click.option("--reason", default=None, help="Why, for the audit trail (at most 500 characters).")


def acts(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options of a command that changes something: ``--as`` and ``--reason``."""
    return as_option(reason_option(command))


def flag_text(value: str | None, flag: str, max_chars: int) -> str | None:
    """A free-text option (``--actor``, ``--commit``) checked here as the service checks its field,
    so that a refusal names the flag the operator typed, not the service's field."""
    from celeryapp.errors import InvalidArgument
    from celeryapp.interfaces.arguments import text_arg

    if value is None:
        return None
    field = flag.removeprefix("--")
    try:
        return text_arg(value, field, max_chars)
    except InvalidArgument as refused:
        raise click.BadParameter(printable(str(refused).removeprefix(f"{field}: ")), param_hint=flag) from None
