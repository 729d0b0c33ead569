"""Poisoned messages: refused at decoding, logged, acknowledged, and the worker lives.

A body or an envelope nested a few hundred levels deep decoded and then killed a prefork worker's
main process while pickling it for the pool (``Unrecoverable error: RecursionError``); restored,
it killed the restarted worker too. An envelope that is not JSON, or not a message, killed it in
the transport's read; so did one nested 5,000 deep published on its remote control channel. A
message of any size was decoded whole; one past ``CHORDBEAT_MAX_MESSAGE_BYTES`` is now dropped undecoded.
"""

from __future__ import annotations

import contextlib
import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery.result import AsyncResult
from kombu import Connection, Producer
from kombu.exceptions import DecodeError
from kombu.serialization import loads as kombu_loads

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.domain.names import CONTROL_QUEUE, PUBLIC_QUEUE, STEPS_QUEUE
from celeryapp.messaging import serialization, unacked
from celeryapp.messaging.serialization import MAX_MESSAGE_DEPTH, envelope, headers_after_body, loads, nesting_depth
from celeryapp.messaging.unacked import UNACKED_INDEX_KEY, UNACKED_KEY
from celeryapp.variables import DEFAULT_MAX_MESSAGE_BYTES
from tests.support import processes
from tests.support.helpers import call, run_once, step, wait_for

SQLITE_ONLY = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
QUEUES = (STEPS_QUEUE, CONTROL_QUEUE, PUBLIC_QUEUE)
#: kombu's Redis transport: the list of a queue's priority ``n`` (0 is the queue's own name).
PRIORITY_SEP = "\x06\x16"
#: Decodes as JSON but is too deep for the pool's pickler in the worker's main process.
PICKLE_KILLING_DEPTH = 900


def nested_lists(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def nested_dicts(depth: int) -> Any:
    value: Any = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def as_json(value: Any) -> bytes:
    with deep_recursion():
        return json.dumps(value).encode()


@contextlib.contextmanager
def deep_recursion() -> Iterator[None]:
    """A sender building deep poison needs more recursion than Python's default."""
    previous = sys.getrecursionlimit()
    sys.setrecursionlimit(max(previous, 50_000))
    try:
        yield
    finally:
        sys.setrecursionlimit(previous)


def test_the_headers_of_an_oversized_message_are_read_without_its_body() -> None:
    headers = {"id": "abc", "task": "chordbeat.get_schedule"}
    stored = json.dumps({"body": "QUJD" * 10_000, "content-encoding": "utf-8", "headers": headers, "properties": {}})
    assert headers_after_body(stored) == headers
    # Not as kombu writes it (a quoted body, headers first, a long tail): nobody to answer.
    assert headers_after_body(json.dumps({"body": 'a"b', "headers": headers})) is None
    assert headers_after_body(json.dumps({"headers": headers, "body": "QUJD"})) is None
    assert headers_after_body(json.dumps({"body": "", "headers": {**headers, "x": "y" * 70_000}})) is None


# -- the bound -------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [nested_lists, nested_dicts])
def test_the_bound_is_exact(make: Any) -> None:
    ok, deep = make(MAX_MESSAGE_DEPTH), make(MAX_MESSAGE_DEPTH + 1)
    assert nesting_depth(ok) == MAX_MESSAGE_DEPTH
    assert loads(as_json(ok)) == ok
    with pytest.raises(DecodeError, match=f"nested more than {MAX_MESSAGE_DEPTH} levels"):
        loads(as_json(deep))


def test_lists_and_dicts_count_alike() -> None:
    mixed: Any = []
    for level in range(MAX_MESSAGE_DEPTH):
        mixed = {"k": mixed} if level % 2 else [mixed]
    assert nesting_depth(mixed) == MAX_MESSAGE_DEPTH + 1
    with pytest.raises(DecodeError):
        loads(as_json(mixed))
    assert nesting_depth(1) == 0 and nesting_depth("[[[") == 0 and nesting_depth({}) == 1


def test_depth_far_beyond_python_recursion_is_measured_and_refused_without_recursing() -> None:
    deep = nested_lists(100_000)
    assert nesting_depth(deep) == MAX_MESSAGE_DEPTH + 1  # stops counting past the bound
    assert nesting_depth(deep, bound=10**6) == 100_000
    with pytest.raises(DecodeError, match="nested more than"):
        loads("[" * 100_000 + "]" * 100_000)
    with pytest.raises(DecodeError, match="nested more than"):
        loads(b'{"a":' * 100_000 + b"1" + b"}" * 100_000)


def test_wide_and_bracket_laden_strings_are_not_deep() -> None:
    wide = {"args": [list(range(10)) for _ in range(20_000)], "k": {str(i): i for i in range(20_000)}}
    assert loads(as_json(wide)) == wide
    brackets = ["[" * 10_000, {"s": "{" * 10_000 + "]" * 500}]
    assert loads(as_json(brackets)) == brackets


@pytest.mark.parametrize(
    "raw",
    [b"\xff\xfe[1]", b"not json", b"[1, 2", "[1]\x00garbage", b'{"__type__": "nope", "__value__": 1}', b"[1]" * 3],
)
def test_what_is_not_json_is_refused_as_a_decode_error(raw: str | bytes) -> None:
    with pytest.raises(DecodeError, match="refused"):
        loads(raw)


def test_the_registry_decodes_json_with_the_bound() -> None:
    serialization.install()
    assert kombu_loads(b'[[], {"a": 1}, {}]', "application/json", "utf-8", accept={"application/json"}) == [
        [],
        {"a": 1},
        {},
    ]
    for raw in ("[" * 101 + "]" * 101, "[" * 5000 + "]" * 5000, b"\xff"):
        with pytest.raises(DecodeError):
            kombu_loads(raw, "application/json", "utf-8", accept={"application/json"})


def good_envelope(**changes: Any) -> dict[str, Any]:
    value: dict[str, Any] = {
        "body": "W10=",
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {"task": "x", "id": "1"},
        "properties": {"delivery_tag": "t", "body_encoding": "base64", "delivery_info": {"routing_key": "q"}},
    }
    return {**value, **changes}


@pytest.mark.parametrize(
    "bad",
    [
        b"\xffnot json",
        as_json([1]),
        as_json(good_envelope(properties=None)),
        as_json(good_envelope(properties={"delivery_tag": 5})),
        as_json(good_envelope(headers=[1])),
        as_json(good_envelope(headers={"h": nested_lists(MAX_MESSAGE_DEPTH)})),
        as_json(good_envelope(body=5)),
        as_json(good_envelope(body="***not base64")),
        as_json(good_envelope(properties={"delivery_tag": "t", "body_encoding": "rot13"})),
    ],
)
def test_an_envelope_the_transport_would_trip_over_is_refused(bad: bytes) -> None:
    with pytest.raises(DecodeError, match="refused"):
        envelope(bad)


def test_a_good_envelope_passes() -> None:
    assert envelope(as_json(good_envelope())) == good_envelope()


@SQLITE_ONLY
def test_a_poisoned_result_fails_its_reader_and_nothing_else(app: ChordbeatCelery, settings: Settings) -> None:
    """Anyone who writes to Redis can poison a stored answer: whoever reads it gets an error."""
    stored = redis.Redis.from_url(settings.result_backend)
    for task_id, result in (("deep", nested_lists(PICKLE_KILLING_DEPTH)), ("deeper", nested_lists(5000))):
        meta = {"status": "SUCCESS", "result": result, "traceback": None, "children": [], "task_id": task_id}
        stored.set(f"celery-task-meta-{task_id}", as_json(meta))
        with pytest.raises(DecodeError, match="nested more than"):
            app.AsyncResult(task_id).get(timeout=5)
    stored.set("celery-task-meta-garbage", b"\xff{")
    with pytest.raises(DecodeError, match="not JSON"):
        app.AsyncResult("garbage").get(timeout=5)


@SQLITE_ONLY
def test_recovery_reads_past_a_poisoned_unacknowledged_entry(app: ChordbeatCelery, settings: Settings) -> None:
    """Recovery looks up kombu's unacknowledged messages; one nested too deep for the JSON decoder
    raised RecursionError out of every recovery pass."""
    broker = redis.Redis.from_url(settings.broker_url)
    good = [{"headers": {"id": "wanted"}}, "", "chordbeat"]
    broker.hset(UNACKED_KEY, mapping={"poison": "[" * 5000 + "]" * 5000, "good": json.dumps(good)})
    broker.zadd(UNACKED_INDEX_KEY, {"poison": 1, "good": 1})
    assert unacked.taken_before(broker, ["wanted"], 10) == {"wanted": b"good"}


# -- a real worker ------------------------------------------------------------------------------


def send_poison(client: Celery, broker_url: str, queue: str) -> int:
    """Every kind of poison to ``queue``, from a plain Celery client, kombu or Redis itself; the
    number of messages sent."""
    task = "chordbeat.examples.sleep"
    with deep_recursion():
        client.send_task(task, args=[nested_lists(PICKLE_KILLING_DEPTH)], queue=queue)
        client.send_task(task, args=[nested_lists(5000)], queue=queue)
        client.send_task(task, kwargs={"seconds": 0}, queue=queue, headers={"h": nested_dicts(PICKLE_KILLING_DEPTH)})
    with Connection(broker_url) as conn:
        task_id = str(uuid.uuid4())
        Producer(conn).publish(
            b"\xff\xfe{[not json",
            routing_key=queue,
            exchange="",
            content_type="application/json",
            content_encoding="utf-8",
            headers={"lang": "py", "task": task, "id": task_id, "root_id": task_id, "parent_id": None, "group": None},
        )
    redis.Redis.from_url(broker_url).lpush(queue, b"\xffnot an envelope")
    return 5


def broadcast_poison(broker_url: str) -> int:
    """Poison published where workers listen for remote control (``celery control``), as any
    Redis client can; the number of messages sent."""
    client = redis.Redis.from_url(broker_url)
    # kombu's pub/sub channel of the "celery.pidbox" exchange (fanout prefix "/<db>.").
    channel = f"/{client.connection_pool.connection_kwargs.get('db', 0)}.celery.pidbox"
    poison = ("[" * 5000 + "]" * 5000, "[1]", b"\xffnot an envelope")
    for data in poison:
        assert client.publish(channel, data) == 1, "the worker listens there"
    return len(poison)


#: Longer than CHORDBEAT_MAX_MESSAGE_BYTES's default: decoded whole, it held several times its size.
OVERSIZED_CHARS = DEFAULT_MAX_MESSAGE_BYTES + 1024


def oversized(client: Celery, broker_url: str) -> AsyncResult:
    """A service call and a remote control broadcast longer than the limit: the call's result."""
    call = client.send_task("chordbeat.get_schedule", kwargs={"name": "x" * OVERSIZED_CHARS}, queue=PUBLIC_QUEUE)
    broker = redis.Redis.from_url(broker_url)
    channel = f"/{broker.connection_pool.connection_kwargs.get('db', 0)}.celery.pidbox"
    assert broker.publish(channel, json.dumps({"body": "x" * OVERSIZED_CHARS})) == 1
    return call


def queued(client: redis.Redis) -> int:
    names = [q if pri == 0 else f"{q}{PRIORITY_SEP}{pri}" for q in QUEUES for pri in range(10)]
    return sum(int(client.llen(name)) for name in names)  # type: ignore[arg-type]


def refusals(output: str) -> int:
    return (
        output.count("Can't decode message body")
        + output.count("was refused and dropped")
        + output.count("was refused undecoded and dropped")
    )


@SQLITE_ONLY
def test_poisoned_messages_on_every_queue_are_refused_and_the_prefork_worker_lives(
    app: ChordbeatCelery, client: Celery, settings: Settings, tmp_path: Path
) -> None:
    broker = redis.Redis.from_url(settings.broker_url)
    with processes.worker(settings, tmp_path, "w1") as worker:
        wait_for(lambda: "ready." in worker.output(), 60, interval=0.2, what="the worker to start")
        sent = sum(send_poison(client, settings.broker_url, queue) for queue in QUEUES)
        sent += broadcast_poison(settings.broker_url)
        too_long = oversized(client, settings.broker_url)
        sent += 2
        wait_for(
            lambda: refusals(worker.output()) >= sent or not worker.running,
            60,
            interval=0.2,
            what="every poisoned message to be refused",
        )
        assert worker.running, worker.output()[-4000:]
        assert refusals(worker.output()) == sent
        assert "nested more than 100 levels deep" in worker.output()
        assert worker.output().count(f"longer than CHORDBEAT_MAX_MESSAGE_BYTES ({DEFAULT_MAX_MESSAGE_BYTES})") == 2
        # Its caller hears why at once, instead of waiting out its timeout.
        with pytest.raises(DecodeError, match="CHORDBEAT_MAX_MESSAGE_BYTES"):
            too_long.get(timeout=10)
        wait_for(lambda: queued(broker) == 0 and broker.hlen(UNACKED_KEY) == 0, 20, what="every message gone")
        # The same worker goes on with a step and a service call.
        assert run_once(client, {"name": "after", "every": 3600, "steps": [step("s")]})["status"] == "completed"
        assert call(client, "chordbeat.get_schedule", name="after")["name"] == "after"
        assert worker.running
        assert "Unrecoverable" not in worker.output()
