"""Celery's remote control, closed to what monitors read.

Every worker listens on a broadcast mailbox (kombu's pidbox, ``celery.pidbox`` in Redis) that
anyone who can publish to the broker can write to: ``shutdown`` stops a worker (and a loop of it
defeats a supervisor's restarts), ``cancel_consumer`` takes the control queue from the control
worker (service calls then go unanswered), ``rate_limit``/``time_limit`` change how steps run,
``revoke`` stops any step whose id it guesses, and ``hello`` merges the ids it carries into the
worker's revoked set. A worker here obeys from the broker only the inspection commands Flower and
``chordbeat`` read (:data:`INSPECTION_COMMANDS`), plus ``enable_events`` (Flower switches task
events on with it), and those an operator turns on (``CHORDBEAT_REMOTE_CONTROL``). Any other
command is refused, logged with what the message says of its sender, and answered with an error
when its caller waits for answers.

Celery's pidbox messages carry no host or process of the sender: what identifies one is its reply
address (``reply_to``: kombu's mailbox id of the calling process, fixed for the process's life)
and ticket, both logged. An attacker can forge them; the refusal does not rely on them.

chordbeat itself sends no command that changes a worker: its cancels stop steps through Redis
flags and the database (the claim of a queued step finds its run over), not through ``revoke``.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

from celery.app.control import Control
from kombu.pidbox import Mailbox, Node

from celeryapp.variables import ALL_REMOTE_CONTROL

logger = logging.getLogger(__name__)

#: Commands that read a worker's state, by every name Celery registers them under. Those are what
#: Flower's worker pages (stats, active_queues, registered, scheduled, active, reserved, revoked,
#: conf), ``celery inspect`` and chordbeat (ping, active_queues) ask. Celery's own inspection
#: commands left out: ``hello`` (it merges the caller's revoked ids), ``objgraph``, ``memdump`` and
#: ``memsample`` (heavy, and objgraph writes files).
INSPECTION_COMMANDS = frozenset(
    {
        "ping",
        "stats",
        "active",
        "dump_active",
        "reserved",
        "dump_reserved",
        "scheduled",
        "dump_schedule",
        "registered",
        "dump_tasks",
        "active_queues",
        "revoked",
        "dump_revoked",
        "query_task",
        "clock",
        "conf",
        "dump_conf",
        "report",
    }
)
#: Changes a worker, but only to send task events, which Flower needs and switches on every few seconds.
MONITORING_COMMANDS = frozenset({"enable_events"})
#: Characters of a refused command's arguments kept in the log line.
LOGGED_ARGUMENT_CHARS = 200


def allowed(command: object, extra: Collection[str]) -> bool:
    """Whether a worker obeys ``command`` from the broker, ``extra`` being what the operator turned on."""
    if not isinstance(command, str):
        return False
    return (
        command in INSPECTION_COMMANDS
        or command in MONITORING_COMMANDS
        or command in extra
        or ALL_REMOTE_CONTROL in extra
    )


def refusal(command: object) -> str:
    """What a caller that waits for answers is told."""
    return (
        f"remote control command {str(command)[:60]!r} refused: chordbeat workers obey only inspection commands "
        "from the broker (CHORDBEAT_REMOTE_CONTROL turns others on; see docs/security.md)"
    )


def _bounded(value: object) -> str:
    text = repr(value)
    return text if len(text) <= LOGGED_ARGUMENT_CHARS else text[: LOGGED_ARGUMENT_CHARS - 1] + "…"


class GuardedNode(Node):  # type: ignore[misc]
    """A worker's mailbox node that refuses what :func:`allowed` does not let through."""

    def dispatch(
        self, method: Any, arguments: Any = None, reply_to: Any = None, ticket: Any = None, **kwargs: Any
    ) -> Any:
        if allowed(method, _extra(self.state)):
            return super().dispatch(method, arguments, reply_to=reply_to, ticket=ticket, **kwargs)  # type: ignore[no-untyped-call]
        origin = reply_to.get("routing_key") if isinstance(reply_to, dict) else None
        # Every worker that starts asks its peers ``hello`` (Celery's mingle; the refusal answers
        # it harmlessly): not worth a warning on each peer at each start.
        logger.log(
            logging.INFO if method == "hello" else logging.WARNING,
            "remote control: refused %s from the broker (caller's reply address %s, ticket %s, "
            "destination %s, arguments %s); CHORDBEAT_REMOTE_CONTROL turns it on",
            _bounded(method),
            _bounded(origin),
            _bounded(ticket),
            _bounded(kwargs.get("destination")),
            _bounded(arguments),
        )
        answer = {"error": refusal(method)}
        if isinstance(reply_to, dict) and {"exchange", "routing_key"} <= reply_to.keys():
            self.reply(  # type: ignore[no-untyped-call]
                {self.hostname: answer},
                exchange=reply_to["exchange"],
                routing_key=reply_to["routing_key"],
                ticket=ticket,
            )
        return answer


def _extra(state: Any) -> Collection[str]:
    settings = getattr(getattr(state, "app", None), "settings", None)
    commands: Collection[str] = getattr(settings, "remote_control", ())
    return commands


class GuardedMailbox(Mailbox):  # type: ignore[misc]
    node_cls = GuardedNode


class GuardedControl(Control):  # type: ignore[misc]
    """``app.control`` of chordbeat's app: workers' mailbox nodes are :class:`GuardedNode`."""

    Mailbox = GuardedMailbox
