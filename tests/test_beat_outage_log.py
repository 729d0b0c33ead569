"""A Redis outage is told in beat's log once (then every 30 s), not once a second, and its end too.

Beat's lock wait and its tick logged a warning at every try, a line a second for as long as Redis
was away: an hour's outage wrote thousands of lines per beat, burying everything else.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.interfaces import service
from tests.support import processes
from tests.support.helpers import step, take_fires, wait_for
from tests.support.servers import RedisServer

pytestmark = pytest.mark.slow

#: Long enough for five tries of each kind a second apart.
OUTAGE_S = 5.0
#: What beat's holder, its standby and either one's tick say at each failed try.
WARNINGS = (
    "cannot reach Redis to extend the lock",
    "cannot reach Redis for the lock",
    "Redis error during tick",
)


#: Names of the schedules each test's beat fired, by the test's database.
_FIRED: dict[str, list[str]] = {}


def fires(app: ChordbeatCelery) -> int:
    """Slots fired so far (taken from the control queue: no worker runs)."""
    return len(take_fires(app, _FIRED.setdefault(app.settings.database_url, [])))


def warnings_of(log: str, kind: str) -> int:
    return sum(1 for line in log.splitlines() if "WARNING" in line and kind in line)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_redis_outage_is_logged_once_and_its_end_too(
    app: ChordbeatCelery, settings: Settings, tmp_path: Path, redis_server: RedisServer
) -> None:
    service.apply_schedule(app, {"name": "ticker", "every": 1, "steps": [step("s")]})
    (tmp_path / "standby-health").mkdir()
    standby_settings = dataclasses.replace(settings, health_dir=str(tmp_path / "standby-health"))
    with processes.beat(settings, tmp_path, "holder") as holder:
        wait_for(lambda: "acquired lock" in holder.output(), 30, what="the first beat to take the lock")
        with processes.beat(standby_settings, tmp_path, "standby") as standby:
            wait_for(lambda: "standing by" in standby.output(), 30, what="the second beat to stand by")
            wait_for(lambda: fires(app) >= 2, 30, interval=0.2, what="beat to fire")
            before = {beat: len(beat.output()) for beat in (holder, standby)}
            # The lock outlives the outage (30 s): the holder extends it again afterwards.
            redis_server.outage(OUTAGE_S, how="graceful", keep_data=True)
            fired_before = fires(app)
            try:
                wait_for(lambda: fires(app) >= fired_before + 2, 30, interval=0.2, what="beat to fire again")
                # Each beat tried about once a second: at most the first try and one more said.
                for beat in (holder, standby):
                    log = beat.output()[before[beat] :]
                    for kind in WARNINGS:
                        assert warnings_of(log, kind) <= 2, f"{kind!r} said {warnings_of(log, kind)} times:\n{log}"
                    # The standby's lock wait tries again up to 5 s after Redis is back.
                    wait_for(lambda: "Redis answered after" in beat.output()[before[beat] :], 30, what="the end said")  # noqa: B023
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n--- holder ---\n{holder.output()[-4000:]}") from exc
            holder_log, standby_log = holder.output()[before[holder] :], standby.output()[before[standby] :]
    # The outage was seen, by both.
    assert warnings_of(holder_log, "cannot reach Redis to extend the lock") == 1, holder_log
    assert warnings_of(standby_log, "cannot reach Redis for the lock") == 1, standby_log
