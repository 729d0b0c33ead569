"""JSON decoding that refuses poison: what is not JSON, or nests deeper than :data:`MAX_MESSAGE_DEPTH`.

Anyone who can write to the broker can send a message; Celery decodes it in the worker's main
process. A body nested a few hundred levels deep decodes, but the prefork pool then pickles its
arguments to hand them to a child, the pickler's recursion limit is hit in the main process and
the worker exits ("Unrecoverable error: RecursionError"); the message is restored and kills the
restarted worker too. Refused here, it raises kombu's :class:`~kombu.exceptions.DecodeError`, and
Celery's consumer logs the message and acknowledges it (``Consumer.on_decode_error``): gone, and
the worker lives. The same decoder reads results (chord parts, service calls' answers), so a
poisoned result fails its reader's ``get`` or chord instead.

The envelope around a body (headers, properties) is JSON that kombu's Redis transport decodes
itself, before any of that: a poisoned one (not JSON, headers nested too deep, not shaped like an
envelope) killed the worker the same way, from the transport's read in the event loop
("Unrecoverable error"). :class:`RefusingEnvelopes` makes the transport's channels
(:mod:`celeryapp.messaging.broker`) refuse it with :func:`envelope`, log it and drop it.

Nor had a message any size limit: a 60 MB one was decoded whole (envelope, base64, JSON: several
times its size in memory) by whichever process took it. One longer than ``CHORDBEAT_MAX_MESSAGE_BYTES``
(the channel's ``max_message_bytes`` transport option) is now dropped before any decoding, and logged
with its queue and size. Its caller is answered when it can be, without decoding the body: kombu
writes the body first, base64 (no quote inside), so what follows its closing quote, the headers
and properties, is read alone when it is short; the answer is the hook :func:`install` was given.
"""

from __future__ import annotations

import binascii
import logging
from base64 import b64decode
from collections.abc import Callable
from queue import Empty
from typing import Any

from kombu.exceptions import DecodeError
from kombu.serialization import registry
from kombu.utils import json as kombu_json
from kombu.utils.encoding import bytes_to_str

from celeryapp.variables import DEFAULT_MAX_MESSAGE_BYTES

logger = logging.getLogger(__name__)

#: Deepest nesting of lists and dicts (the body's own list counts) a message or result may have:
#: far beyond what any task takes, far below what the pickler and ``json`` recurse through.
MAX_MESSAGE_DEPTH = 100
#: Longest envelope without its body read to find whom to answer about an oversized message.
MAX_ENVELOPE_TAIL_BYTES = 64 * 1024
#: kombu's Redis envelope starts with its body.
_BODY_FIRST = b'{"body": "'
#: Told ``(task name, task id, error)`` of a refused message whose headers could be read: the
#: error is what its caller is answered with.
RefusalHook = Callable[[str, str, Exception], None]
_refusal_hooks: list[RefusalHook] = []
#: Celery's (and the app's) content type for ``json``.
JSON_CONTENT_TYPE = "application/json"


class TooDeep(DecodeError):  # type: ignore[misc]
    """Nested deeper than :data:`MAX_MESSAGE_DEPTH`; ``path`` leads from the top to a list or dict
    past the bound (empty when the decoder itself ran out of recursion: where is unknown)."""

    def __init__(self, path: tuple[int | str, ...]) -> None:
        self.path = path
        where = "".join(f"[{repr(step)[:40]}]" for step in path[:4])
        at = f" (at {where})" if path else ""
        super().__init__(f"refused: nested more than {MAX_MESSAGE_DEPTH} levels deep{at}")


def too_deep_path(value: Any, bound: int = MAX_MESSAGE_DEPTH) -> tuple[int | str, ...] | None:
    """The path to the first list or dict found past ``bound`` levels; None if there is none.
    Iterative, like :func:`nesting_depth`."""
    stack: list[tuple[Any, int, tuple[int | str, ...]]] = [(value, 1, ())]
    while stack:
        node, depth, path = stack.pop()
        if not isinstance(node, (list, dict)):
            continue
        if depth > bound:
            return path
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for step, child in items:
            if isinstance(child, (list, dict)):
                stack.append((child, depth + 1, (*path, step)))
    return None


def nesting_depth(value: Any, bound: int = MAX_MESSAGE_DEPTH) -> int:
    """How deep ``value`` nests lists and dicts, counted up to ``bound + 1`` (then it stops).

    Iterative: a structure too deep for Python's recursion limit is measured like any other.
    """
    if not isinstance(value, (list, dict)):
        return 0
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > deepest:
            deepest = depth
            if deepest > bound:
                return deepest
        children = node.values() if isinstance(node, dict) else node
        for child in children:
            if isinstance(child, (list, dict)):
                stack.append((child, depth + 1))
    return deepest


def _bracket_count(data: str | bytes) -> int:
    # An upper bound on the nesting (brackets inside strings count too), at C speed: a typical
    # message has far fewer than the bound and is never walked.
    if isinstance(data, str):
        return data.count("[") + data.count("{")
    return data.count(b"[") + data.count(b"{")


def too_deep(data: str | bytes, value: Any) -> bool:
    """Whether ``value``, decoded from ``data``, nests deeper than :data:`MAX_MESSAGE_DEPTH`
    (walked only when ``data`` holds more brackets than that)."""
    return _bracket_count(data) > MAX_MESSAGE_DEPTH and nesting_depth(value) > MAX_MESSAGE_DEPTH


def loads(data: str | bytes | bytearray | memoryview) -> Any:
    """kombu's JSON decoding, refusing what cannot be decoded or nests too deep."""
    if isinstance(data, (bytearray, memoryview)):
        data = bytes(data)
    try:
        value = kombu_json.loads(data)  # type: ignore[no-untyped-call]
    except RecursionError:
        # Deeper than json's own recursion can go: far past the bound.
        raise TooDeep(()) from None
    except (ValueError, TypeError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise DecodeError(f"refused: not JSON ({exc})") from None
    if too_deep(data, value):
        raise TooDeep(too_deep_path(value) or ())
    return value


def envelope(raw: bytes | str) -> dict[str, Any]:
    """A message as kombu's Redis transport stores it, decoded; :class:`DecodeError` for anything
    its delivery would trip over (the body itself is decoded later, by :func:`loads`)."""
    value = loads(raw)
    if not isinstance(value, dict):
        raise DecodeError("refused: not a message envelope (not a JSON object)")
    properties = value.get("properties")
    if not isinstance(properties, dict) or not isinstance(properties.get("delivery_tag"), str):
        raise DecodeError("refused: not a message envelope (no properties with a delivery tag)")
    if not isinstance(value.get("headers") or {}, dict) or not isinstance(properties.get("delivery_info") or {}, dict):
        raise DecodeError("refused: a message envelope's headers and delivery info must be objects")
    body = value.get("body")
    if body is not None and not isinstance(body, str):
        raise DecodeError("refused: a message envelope's body must be a string")
    encoding = properties.get("body_encoding")
    if body and encoding and str(encoding).lower() != "utf-8":
        if encoding != "base64":  # the transport knows no other codec
            raise DecodeError(f"refused: unknown body encoding {str(encoding)[:40]!r}")
        try:
            b64decode(body)
        except (binascii.Error, ValueError) as exc:
            raise DecodeError(f"refused: a message body is not base64 ({exc})") from None
    return value


def headers_after_body(raw: bytes | str) -> dict[str, Any] | None:
    """An envelope's headers, read without its body: None unless the body is base64 (as kombu
    writes it) and what follows it is short and JSON."""
    data = raw.encode() if isinstance(raw, str) else raw
    end = data.find(b'"', len(_BODY_FIRST)) if data.startswith(_BODY_FIRST) else -1
    if end < 0 or len(data) - end > MAX_ENVELOPE_TAIL_BYTES:
        return None
    try:
        value = loads(b'{"body": ""' + data[end + 1 :])
    except DecodeError:
        return None
    headers = value.get("headers") if isinstance(value, dict) else None
    return headers if isinstance(headers, dict) else None


def task_argument(path: tuple[int | str, ...]) -> str:
    """Which argument of a task message's body (``[args, kwargs, embed]``) ``path`` is in:
    ``args``, ``kwargs.<name>``, or ``arguments`` when it cannot be told."""
    if path[:1] == (0,):
        return "args"
    if path[:1] == (1,) and len(path) > 1:
        return f"kwargs.{str(path[1])[:100]}"
    return "arguments"


def answer_refused(headers: Any, error: Exception) -> None:
    """Answer the caller of a refused message whose headers name its task and id with ``error``."""
    if not isinstance(headers, dict) or not _refusal_hooks:
        return
    task, task_id = headers.get("task"), headers.get("id")
    if isinstance(task, str) and isinstance(task_id, str):
        for hook in _refusal_hooks:
            try:
                hook(task[:200], task_id[:200], error)
            except Exception:  # the refusal stands; only its answer is lost
                logger.exception("broker: could not answer the refused message %.200s", task_id)


def install(on_refused: RefusalHook | None = None) -> None:
    """Decode ``application/json`` with :func:`loads` in this process (kombu's registry is global;
    encoding stays kombu's), and answer oversized messages with ``on_refused``. Idempotent."""
    if on_refused is not None and on_refused not in _refusal_hooks:
        _refusal_hooks[:] = [on_refused]
    registry.register(  # type: ignore[no-untyped-call]
        "json", kombu_json.dumps, loads, content_type=JSON_CONTENT_TYPE, content_encoding="utf-8"
    )


def _envelope_or_none(item: bytes | str, source: str, max_bytes: int) -> dict[str, Any] | None:
    if len(item) > max_bytes:  # a str here is ASCII JSON (kombu's): its length is its size
        reason = f"refused: a message of {len(item)} bytes, longer than CHORDBEAT_MAX_MESSAGE_BYTES ({max_bytes})"
        logger.error("broker: a message from %s was refused undecoded and dropped: %s", source, reason)
        answer_refused(headers_after_body(item), DecodeError(reason))
        return None
    try:
        return envelope(item)
    except DecodeError as exc:
        logger.error("broker: a message from %s was refused and dropped: %s", source, exc)
        return None


class RefusingEnvelopes:
    """Mixed into a ``kombu.transport.redis.Channel``: its three reads of a message (kombu 5.7's
    own, but for the decoding): from a queue's list, blocking or not, and from a broadcast
    (remote control, events) over pub/sub, which kombu decoded letting ``RecursionError`` and
    anything not shaped like a message through. A refused message is already off its list and
    was never delivered, nor recorded as unacknowledged: it is gone."""

    #: Longest message decoded (transport option ``max_message_bytes``); longer ones are dropped.
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES

    def _brpop_read(self, **options: Any) -> bool:
        channel: Any = self
        try:
            try:
                dest_item = channel.client.parse_response(channel.client.connection, "BRPOP", **options)
            except channel.connection_errors:
                # Disconnected, the next poll reconnects.
                channel.client.connection.disconnect()
                raise
            if not dest_item:
                raise Empty()
            dest, item = dest_item
            dest = bytes_to_str(dest).rsplit(channel.sep, 1)[0]  # type: ignore[no-untyped-call]
            channel._queue_cycle.rotate(dest)
            message = _envelope_or_none(item, dest, channel.max_message_bytes)
            if message is not None:
                channel.connection._deliver(message, dest)
            return True
        finally:
            channel._in_poll = None
            channel._flush_brpop_reauth()

    def _get(self, queue: str) -> dict[str, Any]:
        channel: Any = self
        with channel.conn_or_acquire() as client:
            for priority in channel.priority_steps:
                item = client.rpop(channel._q_for_pri(queue, priority))
                if item:
                    message = _envelope_or_none(item, queue, channel.max_message_bytes)
                    if message is None:
                        continue
                    channel._maybe_update_queues_expire(client, queue)
                    return message
            channel._maybe_update_queues_expire(client, queue)
            raise Empty()

    def _receive_one(self, client: Any) -> bool | None:
        channel: Any = self
        try:
            response = client.parse_response()
        except channel.connection_errors:
            channel._in_listen = None
            raise
        if isinstance(response, (list, tuple)):
            payload = channel._handle_message(client, response)
            if bytes_to_str(payload["type"]).endswith("message"):  # type: ignore[no-untyped-call]
                name = bytes_to_str(payload["channel"])  # type: ignore[no-untyped-call]
                if payload["data"]:
                    if name[0] == "/":
                        _, _, name = name.partition(".")
                    message = _envelope_or_none(payload["data"], name, channel.max_message_bytes)
                    if message is None:
                        # Not Empty, as kombu raises: from the second message of a read on, it
                        # escapes the loop over what is buffered, and the rest waits for the
                        # next publication (seen: 50 s).
                        return False
                    delivered: bool = channel._deliver_fanout_message(message, name.split("/", 1)[0])
                    return delivered
        return None
