"""What beat's entries cost Redis: commands per tick and bytes per schedule (issue 41).

At 100,000 minutely schedules beat fires 1,667 slots a second: each Redis command it sends per
due entry (three, RedBeat's way) cost it CPU in the client, and each byte of an entry is paid
100,000 times in Redis. Counted, not timed: the figures hold on any machine.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import redis

from celeryapp.application import ChordbeatCelery
from celeryapp.domain.cadence import Cadence
from celeryapp.interfaces import service
from celeryapp.messaging.redis_client import get_redis
from celeryapp.scheduling import beat_entries
from celeryapp.scheduling.beat import ChordbeatScheduler
from celeryapp.scheduling.beat_entries import CadenceSchedule, ScheduleEntry, entry_name
from tests.support.helpers import fire_messages, step

#: ``MEMORY USAGE`` of a schedule's entry (its hash) at most. It was 824 B for an interval schedule,
#: the definition and meta fields stored as Redis hash table entries of ~330 and ~165 B of JSON.
ENTRY_BYTES_MAX = 600


def due_entries(app: ChordbeatCelery, prefix: str, count: int, due: datetime) -> None:
    """``count`` minutely entries (schedules not in the database), each due at ``due``."""
    for i in range(count):
        name = f"{prefix}-{i:04d}"
        ScheduleEntry(
            name=entry_name(name),
            task=beat_entries.FIRE_TASK,
            schedule=CadenceSchedule(Cadence(cron=None, every_s=60, timezone="UTC", anchor=due)),
            kwargs={"name": name},
            last_run_at=due - timedelta(seconds=60),
            app=app,
        ).save(reset_last_run=True)


@contextmanager
def commands_sent(url: str) -> Iterator[list[str]]:
    """The commands clients send Redis meanwhile (``MONITOR``), leaving out those a script runs."""
    seen: list[str] = []
    ready = threading.Event()
    stop = "chordbeat-test-stop-monitor"

    def listen() -> None:
        with redis.Redis.from_url(url, decode_responses=True).monitor() as monitor:
            ready.set()
            for command in monitor.listen():
                if stop in command["command"]:
                    return
                if command["client_type"] != "lua":
                    seen.append(command["command"])

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    ready.wait(10)
    try:
        yield seen
    finally:
        get_redis(url).echo(stop)
        thread.join(10)


def tick_commands(app: ChordbeatCelery, scheduler: ChordbeatScheduler) -> int:
    with commands_sent(app.settings.redbeat_url) as seen:
        scheduler.tick()
    return len(seen)


def test_a_tick_sends_redis_commands_per_message_not_per_due_entry(app: ChordbeatCelery) -> None:
    """RedBeat sends three commands per due entry (load it, write its last fire time, move its
    score); beat sends one script per thousand entries for each, whatever the number due."""
    scheduler = ChordbeatScheduler(app=app, lazy=True)
    scheduler.lock_key = None  # one beat; and the entries are not in the database to repair from
    scheduler.tick()  # the first tick sets up what every later one reuses (scripts, connections)
    # Keeping the lock and the clock up (once a second) is not the ticks' work being compared.
    scheduler._kept_alive_at = float("inf")
    due_entries(app, "few", 5, datetime.now(UTC) - timedelta(seconds=1))
    few = tick_commands(app, scheduler)
    due_entries(app, "many", 250, datetime.now(UTC) - timedelta(seconds=1))
    many = tick_commands(app, scheduler)
    messages = [len(fires) for fires, _ in fire_messages(app)]
    assert sorted(messages) == [5, 50, 100, 100], messages
    # Each further message of 100 slots: its publish and its queued marker, a few commands.
    assert many - few <= 3 * 2, f"{few} commands for 5 due entries, {many} for 250"


def test_a_schedules_entry_takes_at_most_600_bytes_of_redis(app: ChordbeatCelery) -> None:
    for definition in (
        {"name": "nightly-billing-report", "cron": "0 2 * * *", "timezone": "Europe/Berlin", "steps": [step("a")]},
        {"name": "poll-customer-inbox-0042", "every": 60, "steps": [step("a")]},
    ):
        service.apply_schedule(app, definition)
        key = ScheduleEntry.generate_key(app, entry_name(str(definition["name"])))
        used = get_redis(app.settings.redbeat_url).memory_usage(key)
        assert used is not None and used <= ENTRY_BYTES_MAX, (definition["name"], used)


#: An interval schedule's entry as the previous version stored it, and its meta after a fire.
PREVIOUS_DEFINITION = (
    '{"name": "schedule:upgraded", "task": "chordbeat.fire_schedule", "args": null, "kwargs": {"name": "upgraded"}, '
    '"options": {"queue": "chordbeat.control", "ignore_result": true}, "schedule": {"__type__": "chordbeat_cadence", '
    '"cron": null, "every": 60.0, "timezone": "UTC", "anchor": %r, "retry_at": null}, "enabled": true}'
)
PREVIOUS_META = (
    '{"last_run_at": {"__type__": "datetime", "year": %d, "month": %d, "day": %d, "hour": %d, "minute": %d, '
    '"second": %d, "microsecond": %d, "timezone": 0.0}, "total_run_count": 3}'
)


def previous_version_entry(app: ChordbeatCelery, last_run_at: datetime) -> tuple[str, float]:
    """Overwrite schedule ``upgraded``'s entry as the previous version left it; its key and anchor."""
    client = get_redis(app.settings.redbeat_url)
    key = ScheduleEntry.generate_key(app, entry_name("upgraded"))
    anchor = float(json.loads(client.hget(key, "definition") or "{}")["schedule"]["anchor"])
    at = last_run_at
    meta = PREVIOUS_META % (at.year, at.month, at.day, at.hour, at.minute, at.second, at.microsecond)
    cadence = Cadence(cron=None, every_s=60, timezone="UTC", anchor=datetime.fromtimestamp(anchor, UTC))
    client.hset(key, mapping={"definition": PREVIOUS_DEFINITION % anchor, "meta": meta})
    client.zadd(app.redbeat_conf.schedule_key, {key: cadence.slot_after(last_run_at).timestamp()})
    return key, anchor


def stored(app: ChordbeatCelery, key: str) -> tuple[dict[str, Any], str, float | None]:
    client = get_redis(app.settings.redbeat_url)
    definition, meta = client.hmget(key, "definition", "meta")
    return json.loads(definition or "{}"), meta or "", client.zscore(app.redbeat_conf.schedule_key, key)


def test_entries_the_previous_version_wrote_are_fired_and_rewritten_keeping_their_last_fire(
    app: ChordbeatCelery,
) -> None:
    """An upgraded deployment's Redis holds entries in the previous, longer form: beat fires them
    as before, and the reconcile at its start rewrites each once in the shorter form, keeping
    when beat last fired it (a new last fire time would skip the slot due meanwhile)."""
    service.apply_schedule(app, {"name": "upgraded", "every": 60, "steps": [step("a")]})
    now = datetime.now(UTC)
    key, anchor = previous_version_entry(app, now - timedelta(seconds=61))
    cadence = Cadence(cron=None, every_s=60, timezone="UTC", anchor=datetime.fromtimestamp(anchor, UTC))
    scheduler = ChordbeatScheduler(app=app, lazy=True)
    scheduler.lock_key = None
    scheduler.tick()
    [(fires, _)] = fire_messages(app)
    slot = cadence.latest_slot(datetime.now(UTC), since=now - timedelta(seconds=61))
    assert slot is not None and fires == [{"name": "upgraded", "nominal_at": slot.isoformat(), "trigger": "interval"}]
    _, meta, score = stored(app, key)
    fired_at = json.loads(meta)["last_run_at"]
    assert isinstance(fired_at, float) and now.timestamp() <= fired_at
    assert score == cadence.slot_after(datetime.fromtimestamp(fired_at, UTC)).timestamp()

    last = now - timedelta(seconds=30)
    previous_version_entry(app, last)
    changes = beat_entries.reconcile(app, full=True)
    assert changes.written == ["upgraded"]
    definition, meta, score = stored(app, key)
    assert definition == {
        "name": "schedule:upgraded",
        "task": "chordbeat.fire_schedule",
        "kwargs": {"name": "upgraded"},
        "schedule": {"__type__": "chordbeat_cadence", "every": 60.0, "timezone": "UTC", "anchor": anchor},
    }
    assert ScheduleEntry.decode_meta(meta)["last_run_at"] == last, "when beat last fired it is kept"
    assert score == cadence.slot_after(last).timestamp()
    assert beat_entries.reconcile(app, full=True).empty, "written once"
