"""A corrupt beat entry in Redis (written by anyone with access to it, a bit flip, an older version's
format) must not stop beat: it made the tick raise, beat exit, and every schedule stop.

A real beat process fires schedules every second; entries of some of them are overwritten in Redis
with each kind of corruption. Beat goes on firing the others, logs each bad entry once, and the
next periodic reconcile writes them again from the database.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.interfaces import service
from celeryapp.messaging.redis_client import get_redis
from celeryapp.recovery import lost_slots
from celeryapp.scheduling import beat_entries
from celeryapp.scheduling.beat_entries import ScheduleEntry
from models import Schedule, transaction, utcnow
from tests.support import processes
from tests.support.helpers import step, take_fires, wait_for

pytestmark = pytest.mark.slow

DATETIME_OF_YEAR_0 = {"__type__": "datetime", "year": 0, "month": 1, "day": 1, "timezone": "UTC"}


def corruptions(definition: str) -> dict[str, tuple[str, str]]:
    """Kind of corruption -> (the entry's field, what is written there), from a good definition."""
    good = json.loads(definition)

    def schedule_with(**changes: Any) -> tuple[str, str]:
        return "definition", json.dumps({**good, "schedule": {**good["schedule"], **changes}})

    return {
        "not-json": ("definition", "{not json"),
        "deep-lists": ("definition", "[" * 5000 + "]" * 5000),
        "deep-objects": ("definition", '{"a": ' * 500 + "1" + "}" * 500),
        "a-list": ("definition", json.dumps([good])),
        "no-schedule": ("definition", json.dumps({k: v for k, v in good.items() if k != "schedule"})),
        "unknown-field": ("definition", json.dumps({**good, "relative": True, "x": 1})),
        "kwargs-a-list": ("definition", json.dumps({**good, "kwargs": ["x"]})),
        "bad-cron": schedule_with(cron="61 * * * *", every=None),
        "cron-and-every": schedule_with(cron="* * * * *"),
        "zero-interval": schedule_with(every=0),
        "unknown-zone": schedule_with(timezone="Mars/Olympus_Mons"),
        "nan-anchor": schedule_with(anchor=float("nan")),  # json writes NaN, and reads it back
        "huge-anchor": schedule_with(anchor=1e300),
        "anchor-a-string": schedule_with(anchor="yesterday"),
        "garbage-retry": schedule_with(retry_at="garbage"),
        "meta-not-json": ("meta", "\x00\xff{"),
        "meta-a-list": ("meta", "[]"),
        "meta-far-future": ("meta", json.dumps({"last_run_at": 1e300})),
        "meta-nan": ("meta", json.dumps({"last_run_at": float("nan")})),
        "meta-year-0": ("meta", json.dumps({"last_run_at": DATETIME_OF_YEAR_0})),
        "meta-unknown-zone": (
            "meta",
            json.dumps({"last_run_at": {**DATETIME_OF_YEAR_0, "year": 2020, "timezone": "X/Y"}}),
        ),
        "not-a-hash": ("", "a string, not a hash"),
    }


#: Names of the schedules each test's beat fired, by the test's database.
_FIRED: dict[str, list[str]] = {}


def fired(app: ChordbeatCelery) -> list[str]:
    """Names of the schedules fired so far, in order (taken from the control queue: no worker runs)."""
    return take_fires(app, _FIRED.setdefault(app.settings.database_url, []))


def error_lines(log: str, key: str) -> list[str]:
    return [line for line in log.splitlines() if "ERROR" in line and re.search(rf"entry {re.escape(key)} ", line)]


def fires_after(app: ChordbeatCelery, mark: int, names: set[str]) -> Callable[[], bool]:
    return lambda: names <= set(fired(app)[mark:])


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_corrupt_entries_are_dropped_logged_once_and_written_again_by_the_reconcile(
    app: ChordbeatCelery, settings: Settings, tmp_path: Path
) -> None:
    client = get_redis(settings.redbeat_url)
    kinds = list(corruptions(json.dumps({"schedule": {}})))
    for name in ["good", *kinds]:
        service.apply_schedule(app, {"name": name, "every": 1, "steps": [step("s")]})
    key = {name: ScheduleEntry.generate_key(app, beat_entries.entry_name(name)) for name in ["good", *kinds]}
    good_definition = client.hget(key["good"], "definition")
    with transaction(app.settings.database_url) as session:
        # Unchanged for an hour: the periodic reconcile, which looks at schedules changed since its
        # last pass, would not see them unless told to look at everything.
        session.execute(update(Schedule).values(changed_at=utcnow() - timedelta(hours=1)))
    with processes.beat(settings, tmp_path) as beat:
        try:
            wait_for(fires_after(app, 0, {"good", *kinds}), 30, interval=0.2, what="every schedule to fire")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {sorted(set(fired(app)))}\n{beat.output()[-6000:]}") from exc
        for kind, (field, text) in corruptions(good_definition).items():
            if kind == "not-a-hash":
                client.delete(key[kind])
                client.set(key[kind], text)
            else:
                client.hset(key[kind], field, text)
        mark = len(fired(app))
        try:
            wait_for(
                lambda: not beat.running or all(error_lines(beat.output(), key[k]) for k in kinds),
                30,
                interval=0.2,
                what="every corrupt entry reported",
            )
            assert beat.running, "beat exited"
            # The others go on firing: several slots of the good one after every report.
            reported = len(fired(app))
            wait_for(lambda: fired(app)[reported:].count("good") >= 3, 30, interval=0.2, what="good firing on")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- beat's log ---\n{beat.output()[-6000:]}") from exc
        in_index = set(client.zrange(app.redbeat_conf.schedule_key, 0, -1))
        assert not {key[k] for k in kinds} & in_index, "each corrupt entry is out of the index"
        # The periodic reconcile (not a full one) writes every one again from the database...
        changes = beat_entries.reconcile(app)
        assert set(kinds) <= set(changes.written), changes
        for kind in kinds:
            ScheduleEntry.from_stored(*client.hmget(key[kind], "definition", "meta"), app=app)
        # ...and they fire again.
        mark = len(fired(app))
        wait_for(fires_after(app, mark, set(kinds)), 30, interval=0.2, what="the repaired schedules to fire again")
        log = beat.output()
        assert beat.running
    for kind in kinds:
        assert len(error_lines(log, key[kind])) == 1, (kind, error_lines(log, key[kind]))
    assert "CRITICAL" not in log and "Traceback" not in log, log[-4000:]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_corrupt_entry_of_beats_own_is_written_again_by_beat(
    app: ChordbeatCelery, settings: Settings, tmp_path: Path
) -> None:
    """Beat's own entries (recovery, the reconcile itself) are not in the database: beat writes
    them again itself, before its next tick."""
    client = get_redis(settings.redbeat_url)
    service.apply_schedule(app, {"name": "good", "every": 1, "steps": [step("s")]})
    static = ScheduleEntry.generate_key(app, "chordbeat-recover")  # due every second here
    with processes.beat(settings, tmp_path) as beat:
        wait_for(lambda: "good" in fired(app), 30, interval=0.2, what="a fire")
        client.hset(static, "definition", "[" * 5000 + "]" * 5000)
        client.hset(static, "meta", "{not json")

        def readable() -> bool:
            try:
                ScheduleEntry.from_stored(*client.hmget(static, "definition", "meta"), app=app)
            except Exception:  # still corrupt
                return False
            return client.zscore(app.redbeat_conf.schedule_key, static) is not None

        try:
            wait_for(lambda: not beat.running or (error_lines(beat.output(), static) and readable()), 30, 0.2)
            assert beat.running, "beat exited"
            mark = len(fired(app))
            wait_for(lambda: fired(app)[mark:].count("good") >= 2, 30, interval=0.2, what="good firing on")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- beat's log ---\n{beat.output()[-6000:]}") from exc
        assert len(error_lines(beat.output(), static)) == 1


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_lost_slot_refire_passes_over_a_corrupt_entry(
    app: ChordbeatCelery, caplog: pytest.LogCaptureFixture
) -> None:
    """The re-fire of lost slots reads when beat last fired each overdue schedule: an unreadable
    entry raised out of it (a ResponseError for a key that is not a hash ended the whole pass)."""
    for name in ("meta-not-json", "not-a-hash", "fine"):
        service.apply_schedule(app, {"name": name, "every": 60, "steps": [step("s")]})
    slot = utcnow() - timedelta(minutes=2)
    with transaction(app.settings.database_url) as session:
        session.execute(update(Schedule).values(next_run_at=slot))
    client = get_redis(app.settings.redbeat_url)
    key = {
        name: ScheduleEntry.generate_key(app, beat_entries.entry_name(name)) for name in ("meta-not-json", "not-a-hash")
    }
    client.hset(key["meta-not-json"], "meta", "{not json")
    client.delete(key["not-a-hash"])
    client.set(key["not-a-hash"], "a string")
    # Beat moved past the slot of the good one (it recorded the fire) but the message never came.
    fine = ScheduleEntry.from_key(ScheduleEntry.generate_key(app, beat_entries.entry_name("fine")), app=app)
    fine.reschedule(last_run_at=slot + timedelta(seconds=61))
    assert lost_slots.refire_lost_slots(app) == ["fine"]
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text
