"""A deployment under load while Redis's clock (the reference) jumps forward and back: slots,
deadlines and recovery never see the step (tests/support/clock_shift.c makes the server's clock jump)."""

from __future__ import annotations

import itertools
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
import redis
from sqlalchemy import func, select

from celeryapp.application import ChordbeatCelery
from celeryapp.clock_correction import CORRECTION_KEY, Correction
from celeryapp.config import Settings
from celeryapp.interfaces import service
from celeryapp.messaging import reference_time
from celeryapp.messaging.redis_client import get_redis
from celeryapp.recovery.heartbeat_trust import RECOVERY_SEEN_KEY
from models import (
    Activity,
    ActivityStatus,
    ExecutionStatus,
    Schedule,
    ScheduleExecution,
    SlotOutcome,
    SlotRecord,
    transaction,
)
from tests.support import processes
from tests.support.helpers import step
from tests.support.servers import RedisServer, wait_for


class JumpingRedis(RedisServer):
    """A redis-server whose wall clock is ``shift_file``'s offset off (tests/support/clock_shift.c): a new
    offset makes its TIME, and its keys' expiry, jump within 50 ms."""

    def __init__(self) -> None:
        super().__init__()
        self.shift_file = self.dir / "clock-shift"
        self.shift_file.write_text("0")

    def start(self) -> None:
        preload = {
            "LD_PRELOAD": str(processes.clock_shift_library()),
            "CHORDBEAT_CLOCK_SHIFT_FILE": str(self.shift_file),
        }
        with mock.patch.dict(os.environ, preload):  # the server's environment, not this process's clock
            super().start()

    def jump_to(self, shift_s: float) -> None:
        before = redis.Redis(port=self.port).time()[0] - time.time()
        partial = self.shift_file.with_suffix(".tmp")
        partial.write_text(f"{shift_s}")
        partial.replace(self.shift_file)
        wait_for(
            lambda: abs(redis.Redis(port=self.port).time()[0] - time.time() - shift_s) < 2,
            5,
            what=f"Redis's clock to jump from {before:+.0f} s to {shift_s:+.0f} s",
        )


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    """This module's Redis (the ``settings`` and ``app`` fixtures take it): its clock can jump."""
    server = JumpingRedis()
    server.start()
    yield server
    server.close()


#: Redis's clock offsets in turn: jumps of +30 s, -30 s, +120 s, -120 s, and +3.5 s: longer than
#: a heartbeat's time to live (3 s here) but shorter than recovery's own mark's (5 s).
SHIFTS_S = (30.0, 0.0, 120.0, 0.0, 3.5)
FAST = ("every-1s", "every-2s")
#: Fires of each fast schedule after a jump that show beat goes on (before the correction it fired
#: nothing for 20 s): five of every-1s span 4 s at least, more than a heartbeat's TTL (3 s here),
#: so a recovery pass after them judges the long step's heartbeat past any grace the jump gave.
FIRES_AFTER_JUMP = {"every-1s": 5, "every-2s": 2}
LOAD = [
    {"name": "every-1s", "every": 1, "steps": [step("quick")]},
    {"name": "every-2s", "every": 2, "steps": [step("a", kwargs={"seconds": 0.5}), step("b")]},
    # Steps always running, with deadlines: a run's (timeout) and a step's.
    {
        "name": "long-steps",
        "every": 6,
        "timeout": 20,
        "steps": [step("long", kwargs={"seconds": 5}, timeout=15)],
    },
    {"name": "minutely", "cron": "* * * * *", "steps": [step("s")]},
]


def fired(app: ChordbeatCelery) -> dict[str, int]:
    with transaction(app.settings.database_url) as session:
        rows = session.execute(
            select(Schedule.name, func.count())
            .join(SlotRecord, SlotRecord.schedule_id == Schedule.id)
            .where(SlotRecord.outcome == SlotOutcome.FIRED)
            .group_by(Schedule.name)
        )
        return {name: count for name, count in rows}


def long_step_running(app: ChordbeatCelery) -> bool:
    with transaction(app.settings.database_url) as session:
        running = select(func.count()).where(
            Activity.step_name == "long", Activity.status == ActivityStatus.IN_PROGRESS
        )
        return bool(session.scalar(running))


def differs_by(client: redis.Redis, recorded: str) -> float:
    """Seconds between the time the stored correction gives now and the time ``recorded`` gives."""
    seconds, microseconds = client.time()
    raw = seconds + microseconds / 1_000_000
    stored = client.get(CORRECTION_KEY)
    if stored is None:
        return math.inf
    return Correction.from_text(stored).corrected(raw) - Correction.from_text(recorded).corrected(raw)


def troubles(app: ChordbeatCelery, output: str) -> list[object]:
    """What a step of the deployment's time leaves: slots recorded missed, step attempts failed or run
    again, runs failed (a deadline passed early), fire batches refused as in the future."""
    with transaction(app.settings.database_url) as session:
        missed = session.execute(
            select(Schedule.name, SlotRecord.nominal_at).join(Schedule).where(SlotRecord.outcome == SlotOutcome.MISSED)
        ).all()
        attempts = session.execute(
            select(Activity.step_name, Activity.attempt, Activity.status, Activity.error).where(
                Activity.status.not_in([ActivityStatus.COMPLETE, ActivityStatus.IN_PROGRESS]) | (Activity.attempt > 1)
            )
        ).all()
        runs = session.execute(
            select(ScheduleExecution.id, ScheduleExecution.error).where(
                ScheduleExecution.status == ExecutionStatus.FAILED
            )
        ).all()
    refused = [line for line in output.splitlines() if "in the future" in line]
    return [*missed, *attempts, *runs, *refused]


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
@pytest.mark.timeout(300)
def test_a_deployment_keeps_time_while_redis_clock_jumps_either_way(
    app: ChordbeatCelery, settings: Settings, tmp_path: Path, redis_server: JumpingRedis
) -> None:
    """Before: after +30 s and +120 s jumps slots were recorded missed and fire batches refused;
    after a jump back beat fired nothing (and recovery did not run) for the size of the jump."""
    client = get_redis(settings.broker_url)
    for definition in LOAD:
        service.apply_schedule(app, definition)
    with (
        processes.worker(settings, tmp_path, "w1", concurrency=4) as worker,
        processes.beat(settings, tmp_path) as beat,
    ):
        wait_for(lambda: all(fired(app).get(n, 0) >= 2 for n in FAST), 60, interval=0.3, what="the load to start")
        for shift_s in SHIFTS_S:
            wait_for(lambda: long_step_running(app), 15, interval=0.2, what="a long step at work")
            counts = fired(app)
            client.set(RECOVERY_SEEN_KEY, "before the jump")
            redis_server.jump_to(shift_s)
            jump = f"after the jump to {shift_s:+.0f} s"
            try:
                wait_for(
                    lambda c=counts: all(fired(app).get(n, 0) >= c.get(n, 0) + k for n, k in FIRES_AFTER_JUMP.items()),  # type: ignore[misc]
                    20,
                    interval=0.3,
                    what=f"beat to go on firing {jump}",
                )
                # 30 s, not the recovery interval: on a loaded machine a pass's message (expiring after
                # one interval) can wait behind steps on this all-queues worker and be dropped, more than
                # once. A jump that stopped recovery stopped it for the jump's size (120 s).
                wait_for(lambda: client.get(RECOVERY_SEEN_KEY) == "1", 30, what=f"a recovery pass {jump}")
                client.set(RECOVERY_SEEN_KEY, "past the grace")
                wait_for(
                    lambda: client.get(RECOVERY_SEEN_KEY) == "1", 30, what=f"a recovery pass past the grace {jump}"
                )
            finally:
                print(beat.output()[-3000:])  # shown if it fails
            found = troubles(app, beat.output() + worker.output())
            assert not found, (jump, len(found), found[:5])
        assert "Redis's clock jumped" in beat.output() + worker.output()
        recorded = client.get(CORRECTION_KEY)
        correction = reference_time.shared_correction(client)
        assert correction is not None and correction.correction.jumps == len(SHIFTS_S), correction
        # Redis loses the record (a restart without its data): the processes write it back at their
        # next measurement: a recovery pass's, or within the clock's 30 s measure interval when passes
        # are late (see above). The first to measure may not have measured since the last jump: it
        # writes back the record it knows and then records that jump itself, so the text may differ
        # from the one lost; the time it gives must not (the jumps it covers do not reappear).
        client.delete(CORRECTION_KEY)
        written = wait_for(lambda: client.get(CORRECTION_KEY), 45, interval=0.1, what="the record written back")
        assert isinstance(written, str) and isinstance(recorded, str)
        wait_for(
            lambda: abs(differs_by(client, recorded)) < 1.0,
            45,
            interval=0.1,
            what="the time of the record written back to be the lost one's",
        )
    # The every-second schedule's slots, whatever became of each, are a second apart throughout.
    with transaction(app.settings.database_url) as session:
        slots = session.scalars(
            select(SlotRecord.nominal_at)
            .join(Schedule)
            .where(Schedule.name == "every-1s")
            .order_by(SlotRecord.nominal_at)
        ).all()
    gaps = {round((later - earlier).total_seconds(), 2) for earlier, later in itertools.pairwise(slots)}
    assert gaps == {1.0}, gaps
