"""Redis fails over: behind a DNS name or virtual IP (the old primary comes back as a read-only
replica) and behind Sentinels (SIGKILL of the primary, ``SENTINEL FAILOVER``). Every client of a
chordbeat process follows the primary: its own (heartbeats, fences, leases, recovery), kombu's
(the broker), RedBeat's and the result backend's."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis

from celeryapp.application import ChordbeatCelery
from celeryapp.client import ChordbeatClient
from celeryapp.config import Settings
from celeryapp.interfaces import service
from celeryapp.messaging.redis_client import get_redis, reset_clients
from celeryapp.recovery.recovery import recover
from tests.support import processes
from tests.support.helpers import call, rode_out, running, step, ts
from tests.support.sentinel import Forwarder, SentinelCluster
from tests.support.servers import RedisServer, wait_for

#: Not the default name: every client must be told it.
MASTER = "chordbeat-primary"
#: A heartbeat outlives a failover: a SIGKILLed primary is replaced in about 3 s here, but a
#: Sentinel election that fails is held again only after twice the failover timeout (10 s).
FAILOVER_TTL_S = 30.0


class MovedPrimary:
    """Two servers behind a name (:class:`Forwarder`): ``old`` the primary, ``new`` its replica."""

    def __init__(self) -> None:
        self.old, self.new = RedisServer(), RedisServer()
        self.old.start()
        self.new.start()
        self.direct(self.new).replicaof("127.0.0.1", self.old.port)
        wait_for(lambda: self.direct(self.new).info("replication")["master_link_status"] == "up", 10)
        self.name = Forwarder(self.old.port)

    @staticmethod
    def direct(server: RedisServer) -> redis.Redis:
        return redis.Redis(port=server.port, decode_responses=True)

    def fail_over(self) -> None:
        """What an operator's failover does: promote the replica, demote the primary, move the name."""
        self.direct(self.new).replicaof("NO", "ONE")
        self.direct(self.old).replicaof("127.0.0.1", self.new.port)
        self.name.point_to(self.new.port)

    def close(self) -> None:
        self.name.close()
        self.old.close()
        self.new.close()


@pytest.fixture
def moved() -> Iterator[MovedPrimary]:
    servers = MovedPrimary()
    yield servers
    servers.close()


def test_writes_refused_by_a_demoted_primary_reconnect_to_where_the_name_now_points(moved: MovedPrimary) -> None:
    """Before: every write on the pooled connection answered ReadOnlyError, forever."""
    reset_clients()
    client = get_redis(moved.name.url)
    script = client.register_script("return redis.call('SET', KEYS[1], ARGV[1])")
    client.set("plain", "before")
    moved.fail_over()
    # A command, a pipeline (the step watch's heartbeats), a transaction, a script (RedBeat's lock).
    client.set("plain", "after")
    with client.pipeline(transaction=False) as pipe:
        pipe.set("heartbeat", "1", ex=30).exists("fence").execute()
    with client.pipeline() as pipe:
        pipe.set("transaction", "1").incr("counter").execute()
    script(keys=["script"], args=["ran"])
    new = moved.direct(moved.new)
    assert new.mget("plain", "heartbeat", "transaction", "script") == ["after", "1", "1", "ran"]


def test_the_broker_connection_publishes_and_consumes_again_after_the_primary_moved(
    moved: MovedPrimary, app: ChordbeatCelery
) -> None:
    """kombu's channel client: before, taking a message (BRPOP, a write) failed with ReadOnlyError
    on every try, a channel error the consumer does not reconnect on."""
    app.apply_settings(replace(app.settings, broker_url=moved.name.url, redbeat_url=moved.name.url))
    with app.connection_for_write() as conn, conn.SimpleQueue("failover-test") as queue:
        queue.put({"n": 1}, retry=True)
        # Replicated before the failover: a write the old primary had not passed on is lost with it.
        wait_for(lambda: moved.direct(moved.new).llen("failover-test") == 1, 10, what="n=1 on the replica")
        moved.fail_over()
        queue.put({"n": 2}, retry=True)
        # A connection error is what the worker's consumer reconnects on; it tries again.
        got = wait_for(lambda: queue.get(timeout=1), 20, what="a message taken from the new primary")
        got.ack()
    assert got.payload == {"n": 1}
    assert moved.direct(moved.new).llen("failover-test") == 1
    # RedBeat's client is chordbeat's own: it follows too.
    app.redbeat_redis.set("redbeat-write", "1")
    assert moved.direct(moved.new).get("redbeat-write") == "1"


def test_a_publish_batch_refused_by_a_demoted_primary_lands_once_on_the_new_one(
    moved: MovedPrimary, app: ChordbeatCelery
) -> None:
    """A fire batch publishes its first groups in one pipeline (kombu's Producer.batch(), which
    kombu allows only on connections that retry nothing): ours retry only what a demoted primary
    refused, so the whole pipeline goes once more, to the new primary, and no message twice."""
    app.apply_settings(replace(app.settings, broker_url=moved.name.url, redbeat_url=moved.name.url))
    with app.connection_for_write() as conn, conn.Producer() as producer:
        producer.publish({"n": 0}, routing_key="failover-batch")  # its pooled connection, to the old primary
        assert producer.channel.supports_batch_publish  # else kombu publishes each message alone
        wait_for(lambda: moved.direct(moved.new).llen("failover-batch") == 1, 10, what="n=0 on the replica")
        moved.fail_over()
        refused = moved.direct(moved.old).info("stats")["total_error_replies"]
        with producer.batch():
            for n in range(1, 4):
                producer.publish({"n": n}, routing_key="failover-batch")
        assert moved.direct(moved.old).info("stats")["total_error_replies"] > refused  # READONLY: it was tried there
    assert moved.direct(moved.new).llen("failover-batch") == 4


def run_through_failover(
    app: ChordbeatCelery, settings: Settings, tmp_path: Path, fail_over: Callable[[], None]
) -> tuple[dict[str, Any], float]:
    """A worker and beat configured with ``settings``: a run whose long step is under way when
    Redis fails over finishes, and beat's runs go on. The run, and the seconds from the failover
    to the first step of beat's runs after it."""
    client = ChordbeatClient(settings.broker_url, settings.result_backend, sentinel_master=settings.sentinel_master)
    with processes.worker(settings, tmp_path, "w1") as worker, processes.beat(settings, tmp_path) as beat:
        steps = [step("before"), step("long", kwargs={"seconds": 4}), step("after")]
        call(client.app, "chordbeat.apply_schedule", definition={"name": "through", "every": 3600, "steps": steps})
        call(client.app, "chordbeat.apply_schedule", definition={"name": "ticker", "every": 1, "steps": [step("t")]})
        wait_for(lambda: service.list_executions(app, "ticker"), 60, interval=0.3, what="beat to fire")
        execution_id = call(client.app, "chordbeat.trigger_schedule", name="through")["execution_id"]
        running(client.app, execution_id, "long")
        fault = datetime.now(UTC)
        fail_over()
        try:
            done, fresh = rode_out(app, execution_id, "ticker", fault, "failover")
        except AssertionError as exc:
            logs = f"--- beat ---\n{beat.output()[-6000:]}\n--- worker ---\n{worker.output()[-6000:]}"
            raise AssertionError(f"{exc}\n{logs}") from exc
        assert worker.running, worker.output()[-3000:]
        assert beat.running, beat.output()[-3000:]
        log = worker.output()
    assert "Unrecoverable error" not in log
    # Recovery passes that met the failover logged it and went on; none crashed.
    assert not re.search(r"chordbeat\.recover\[[^\]]*\] raised unexpected", log), log[-3000:]
    first_step = min(ts(a["started_at"]) for e in fresh for a in e["activities"])
    return done, (first_step - fault).total_seconds()


def assert_each_step_ran_once(done: dict[str, Any]) -> None:
    assert done["status"] == "completed", done
    # The step running through the failover kept its heartbeat: attempt 1, not taken for lost.
    assert [(a["step"], a["status"], a["attempt"]) for a in done["activities"]] == [
        ("before", "complete", 1),
        ("long", "complete", 1),
        ("after", "complete", 1),
    ]


@pytest.mark.slow
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_worker_and_beat_behind_a_name_ride_out_a_failover(
    moved: MovedPrimary, app: ChordbeatCelery, settings: Settings, tmp_path: Path
) -> None:
    """Before: beat's tick met ReadOnlyError on every pass and fired nothing more."""
    through_name = replace(
        settings, broker_url=moved.name.url, result_backend=moved.name.url, redbeat_url=moved.name.url
    )
    through_name = replace(through_name, heartbeat_ttl_s=FAILOVER_TTL_S)
    app.apply_settings(through_name)
    done, seconds = run_through_failover(app, through_name, tmp_path, moved.fail_over)
    assert_each_step_ran_once(done)
    print(f"\nfailover behind a name: a fired step ran again {seconds:.1f}s after it")


@pytest.fixture
def cluster() -> Iterator[SentinelCluster]:
    servers = SentinelCluster(master=MASTER)
    servers.start()
    yield servers
    servers.close()


@pytest.mark.slow
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("how", ["sigkill", "sentinel-failover"])
@pytest.mark.timeout(120)
def test_worker_and_beat_on_sentinels_ride_out_a_failover(
    cluster: SentinelCluster, app: ChordbeatCelery, settings: Settings, tmp_path: Path, how: str
) -> None:
    """Every URL a Sentinel list: broker (kombu's Sentinel transport), results, RedBeat and
    chordbeat's own clients. Before: the broker URL was refused ('sentinel' is not a transport we
    use) and get_redis raised ValueError."""
    sentinels = cluster.settings_for(settings, heartbeat_ttl_s=FAILOVER_TTL_S)
    reset_clients()
    app.apply_settings(sentinels)

    def fail_over() -> None:
        old = cluster.kill_primary() if how == "sigkill" else cluster.force_failover()
        cluster.wait_promoted(old)

    done, seconds = run_through_failover(app, sentinels, tmp_path, fail_over)
    assert_each_step_ran_once(done)
    print(f"\nSentinel failover ({how}): a fired step ran again {seconds:.1f}s after the fault")


@pytest.mark.parametrize("url", ["sentinel://127.0.0.1:1/0", "sentinel://127.0.0.1:1/0;sentinel://127.0.0.1:2/0"])
def test_a_recovery_pass_rides_out_sentinels_that_do_not_answer(app: ChordbeatCelery, url: str) -> None:
    """No primary found is a Redis error like any other: the pass logs it and does its database
    repairs. Before: get_redis raised ValueError on a sentinel:// URL, out of the pass."""
    reset_clients()
    app.apply_settings(replace(app.settings, broker_url=url, redbeat_url=url))
    report = recover(app)
    assert not report.redis_reset
